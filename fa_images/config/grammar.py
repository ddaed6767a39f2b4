"""The grammar of every value that can reach a generated file: a Dockerfile, a workflow, a bake file.

A matrix or compat file is input from whoever wrote it, and a Dockerfile is a program: a
newline in a base image adds an instruction, a ``$()`` in an index URL runs a command.
So each value is checked against its own grammar (an image reference, an index URL, a
PEP 440 pin, a version) when the file is loaded, and the template quotes it again as
defence in depth (see render.py). Each check returns None when the value is good, else
what is wrong with it, phrased to follow "<key> ..." in an error line.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Literal, get_args

from packaging.version import InvalidVersion, Version

from ..builder import untrusted
from ..builder.untrusted import shown_url

# distribution/reference's grammar, as the Docker Engine applies it.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = (
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:]+\])"
)
REPOSITORY = re.compile(rf"(?:{_DOMAIN}(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*", re.ASCII)
TAG = re.compile(r"[\w][\w.-]{0,127}", re.ASCII)
DIGEST = re.compile(r"[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[0-9a-fA-F]{32,}", re.ASCII)
MAX_REPOSITORY = 255

PUBLIC_VERSION = re.compile(r"\d+(?:\.\d+)*(?:(?:a|b|rc)\d+)?(?:\.post\d+)?(?:\.dev\d+)?", re.ASCII)
PYTHON = re.compile(r"3\.\d{1,2}", re.ASCII)
CUDA = re.compile(r"\d{2}\.\d", re.ASCII)
CUDA_RELEASE = re.compile(r"\d{2}\.\d\.\d+", re.ASCII)
CAPABILITY = re.compile(r"\d{1,2}\.\d", re.ASCII)
SHA256 = re.compile(r"[0-9a-f]{64}")
PROJECT = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?", re.ASCII)
NETWORK = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", re.ASCII)
# A memory size as `docker build --memory` takes it: a number and a binary unit (6g = 6 GiB).
MEMORY = re.compile(r"(\d{1,15})\s*([kmgt]?)(?:i?b)?", re.ASCII | re.IGNORECASE)
MIN_BUILD_MEMORY = 1 << 30
# What an index URL may hold besides its scheme, host and port. No quotes, spaces, `$`,
# backticks, `;`, `&`, `|`, `<`, `>`, parentheses, braces or backslashes.
_URL_PATH = re.compile(r"[A-Za-z0-9._~%/:@+=,-]*", re.ASCII)
# A URL's login (user:token@): RFC 3986's unreserved characters, %XX, and the ':' after the user.
# Nothing else, so that fa-images and pip read the same host (urllib takes `a\@b` as a login
# before host b, pip as host a) and no shell reads a command in it.
_LOGIN = re.compile(r"(?:[A-Za-z0-9._~+=,:-]|%[0-9A-Fa-f]{2})*", re.ASCII)
# The authority of each URL inside a value (a pip install target, a cache spec): scheme://authority.
_AUTHORITY = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]*)", re.ASCII)
# The words of a buildx cache attribute that holds a credential (gha's token and ghtoken, s3's
# access_key_id, secret_access_key and session_token, azblob's account_key, and any new one named
# so): buildx reads each from the environment of the job when the spec leaves it out.
_CACHE_SECRET_WORDS = re.compile(r"token|secret|passw|credential|key", re.ASCII)


def repository(value: str) -> str | None:
    """An image name without a tag: ``ghcr.io/acme/flash-attn``."""
    if len(value) > MAX_REPOSITORY:
        return f"is {len(value)} characters long; Docker allows {MAX_REPOSITORY}"
    if not REPOSITORY.fullmatch(value):
        return "is not a repository name (lower case letters, digits, '.', '_', '-', '/', an optional registry host)"
    return None


def image_reference(value: str) -> str | None:
    """A full image reference: ``name[:tag][@digest]``, as FROM takes it."""
    name, _, digest = value.partition("@")
    if digest and not DIGEST.fullmatch(digest):
        return f"has a malformed digest {digest!r}"
    slash = name.rfind("/")
    colon = name.rfind(":")
    tag = None
    if colon > slash:  # a colon after the last slash starts the tag; before it, it is a port
        name, tag = name[:colon], name[colon + 1 :]
    if tag is not None and not TAG.fullmatch(tag):
        return f"has a tag {tag!r} that Docker refuses (letters, digits, '_', '.', '-'; at most 128)"
    return repository(name)


def image_tag(value: str) -> str | None:
    if not TAG.fullmatch(value):
        return f"{value!r} is not a valid image tag (letters, digits, '_', '.', '-'; at most 128 characters)"
    return None


def version(value: str) -> str | None:
    """A public PEP 440 version: no local ``+label``, no spaces, nothing a tag cannot hold."""
    if not PUBLIC_VERSION.fullmatch(value):
        why = "has a local '+' part" if "+" in value else "is not a version number"
        return f'{value!r} {why} (e.g. "2.9.1"; the CUDA variant goes in cuda:)'
    return None


def matches(pattern: re.Pattern[str], example: str) -> Callable[[str], str | None]:
    """A check for a fixed pattern: ``matches(CUDA, "12.8")``."""

    def check(value: str) -> str | None:
        return None if pattern.fullmatch(value) else f"{value!r} is not of the form {example!r}"

    return check


def pin(value: str) -> str | None:
    """``name==version``, as a build-tool pin."""
    name, sep, ver = value.partition("==")
    if not sep or not PROJECT.fullmatch(name):
        return f"{value!r} is not a pin like 'ninja==1.13.2'"
    try:
        Version(ver)
    except InvalidVersion:
        return f"{value!r} pins {ver!r}, which is not a version"
    if not re.fullmatch(r"[0-9A-Za-z.!+-]+", ver):
        return f"{value!r} is not a pin like 'ninja==1.13.2'"
    return None


def library_pin(value: str) -> str | None:
    """``name==version`` or ``name[extra,...]==version``, as torch pins its CUDA libraries
    (``cuda-toolkit[cublas,cudart]==13.0.2``); quoted as one shell word where it is written."""
    name, extras, rest = value.partition("[")
    if extras:
        listed, closed, rest = rest.partition("]")
        if not closed or not rest.startswith("==") or not all(PROJECT.fullmatch(e) for e in listed.split(",")):
            return f"{value!r} is not a pin like 'cuda-toolkit[cublas,cudart]==13.0.2'"
        value = name + rest
    return pin(value)


def index_url(value: str) -> str | None:
    """An http(s) or file URL of a package index or a find-links page."""
    shown = repr(shown_url(value))  # an error line must not print the token it complains about
    if not value.isprintable() or " " in value:
        return f"{shown} holds spaces or control characters"
    try:
        parts = urllib.parse.urlsplit(value)
        host, _port = parts.hostname, parts.port
    except ValueError:
        return f"{shown} has a malformed host or port"
    if parts.scheme not in ("http", "https", "file"):
        return f"{shown} is not an http(s):// or file:// URL"
    login, at, _ = parts.netloc.rpartition("@")
    if at and parts.scheme == "file":
        return f"{shown} is a file:// URL with a login; a file is read without one"
    if at and not _LOGIN.fullmatch(login):
        return f"{shown} has a login with characters a login does not need (write them as %XX)"
    if parts.scheme != "file" and not (host and re.fullmatch(_DOMAIN, f"[{host}]" if ":" in host else host, re.ASCII)):
        return f"{shown} has no valid host"
    if parts.query or parts.fragment or not _URL_PATH.fullmatch(parts.path):
        return f"{shown} holds characters an index URL does not need (quotes, $, ;, &, ?, #, ...)"
    return None


PUBLIC_URL_RULE = "an http(s):// URL without a login"  # said the same way in --help and in errors


def public_url(value: str) -> str | None:
    """An http(s) URL read or linked to without a login: a published index, where its wheels are.
    One rule (PUBLIC_URL_RULE), checked scheme first, so a folder or a file:// URL hears it too."""
    try:
        scheme = urllib.parse.urlsplit(value).scheme.lower()
    except ValueError:
        scheme = ""
    if scheme not in ("http", "https"):
        return f"{shown_url(value)!r} is not {PUBLIC_URL_RULE}"
    return url_without_login(value, why=f"it must be {PUBLIC_URL_RULE}")


def url_without_login(value: str, *, why: str = "a generated file never holds one") -> str | None:
    """An index URL that a generated file holds as it is (``bases.python_mirror``): no login."""
    problem = index_url(value)
    if problem is None and has_credentials(value):
        problem = f"{shown_url(value)!r} holds a login; {why}"
    return problem


def find_links(value: str) -> str | None:
    """A find-links location: an index URL, or an absolute directory inside the image."""
    if value.startswith("/"):
        return None if _URL_PATH.fullmatch(value) else f"{value!r} holds characters a path here may not"
    return index_url(value)


def has_credentials(url: str) -> bool:
    return "@" in urllib.parse.urlsplit(url).netloc


def without_credentials(url: str) -> str:
    """The URL with any ``user:token@`` removed: what may be written into a file."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def scrubbed(text: str, urls: Iterable[str]) -> str:
    """``text`` (what a child process printed) with the login of each of ``urls`` replaced by
    ``***``, as written and percent-decoded: pip redacts its http(s) URLs, not every other form."""
    for url in urls:
        login = urllib.parse.urlsplit(url).netloc.rpartition("@")[0]
        password = login.partition(":")[2]
        secrets = {login, urllib.parse.unquote(login), password, urllib.parse.unquote(password)}
        for secret in sorted(secrets, key=len, reverse=True):  # the whole login before its password
            if len(secret) >= 3:  # shorter would blank out ordinary text
                text = text.replace(secret, "***")
    return text


def _carries_login(value: str) -> bool:
    """Whether a URL in ``value`` has a login that is a credential: any on http(s) (a token may be
    the user), a user:password on ssh (git+ssh://git@host is no secret)."""
    for match in _AUTHORITY.finditer(value):
        login, at, _ = match.group(2).rpartition("@")
        if at and (":" in login or not match.group(1).lower().endswith("ssh")):
            return True
    return False


def _logins_hidden(value: str) -> str:
    return _AUTHORITY.sub(
        lambda m: f"{m.group(1)}://{'***@' if '@' in m.group(2) else ''}{m.group(2).rpartition('@')[2]}", value
    )


def network(value: str) -> str | None:
    """A ``docker build --network`` mode: default, host, none, bridge or a network's name."""
    return None if NETWORK.fullmatch(value) else f"{value!r} is not a network mode (e.g. host, none, or a name)"


# When `build` pulls the base images (build.pull, build --pull); the first is the default.
PullPolicy = Literal["missing", "always", "never"]
PULL_POLICIES: tuple[str, ...] = get_args(PullPolicy)


def pull_policy(value: str) -> str | None:
    return None if value in PULL_POLICIES else f"must be one of {', '.join(PULL_POLICIES)}, not {value!r}"


# Which builder makes the images (build.builder, build --builder): "auto" takes BuildKit where the
# docker CLI has it and the engine is Docker's, else the docker SDK's legacy builder.
BuilderChoice = Literal["auto", "buildkit", "sdk"]
BUILDER_CHOICES: tuple[str, ...] = get_args(BuilderChoice)
# The two forms of a Dockerfile, one per builder.
BuilderForm = Literal["buildkit", "sdk"]


def builder_choice(value: str) -> str | None:
    return None if value in BUILDER_CHOICES else f"must be one of {', '.join(BUILDER_CHOICES)}, not {value!r}"


def memory_bytes(value: str) -> int:
    """'6g' -> 6 GiB in bytes; raises ValueError for anything else."""
    match = MEMORY.fullmatch(value.strip())
    if not match:
        raise ValueError(value)
    return int(match.group(1)) << (10 * " kmgt".index(match.group(2).lower() or " "))


def memory(value: str) -> str | None:
    """A build memory limit such as 6g, 16GiB or 8192m, at least 1 GiB."""
    try:
        size = memory_bytes(value)
    except ValueError:
        return f"{value!r} is not a memory size (e.g. 16g, 16GiB, 8192m)"
    return None if size >= MIN_BUILD_MEMORY else f"{value!r} is less than the 1 GiB a build needs at the least"


def printable(value: str) -> bool:
    """No control characters: a newline is a new Dockerfile instruction."""
    return value.isprintable()


# --- values that reach a generated workflow or bake file ---------------------------------------
# GitHub expands ``${{ ... }}`` in a workflow before any shell sees it, and bake interpolates
# ``${VAR}``: no such value may come from input. Only the tool writes expressions (secrets).
RUNNER_LABEL = re.compile(r"[A-Za-z0-9_.:/+=-]{1,128}", re.ASCII)
SECRET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}", re.ASCII)
# setup-python's python-version: 3.12, 3.12.4, 3.13t, pypy3.10.
SETUP_PYTHON = re.compile(r"(?:pypy)?3\.\d{1,2}(?:\.\d{1,3})?t?", re.ASCII)
# A file path, as the workflow and its build command name it.
REPO_PATH = re.compile(r"[A-Za-z0-9_.@+=,~/-]{1,255}", re.ASCII)
# What `pip install` takes: a path, a requirement (name[extras] op version), a VCS or http URL.
INSTALL_SPEC = re.compile(r"[A-Za-z0-9_.@+=,~/:!<>\[\]#%-]{1,255}", re.ASCII)
_CACHE_PAIR = r"[a-z][a-z0-9_-]*=[A-Za-z0-9_.@+~/:-]+"
CACHE_SPEC = re.compile(rf"{_CACHE_PAIR}(?:,{_CACHE_PAIR})*", re.ASCII)
_GIT_TAG_CHARS = re.compile(r"[A-Za-z0-9_.+/-]{1,128}", re.ASCII)


CRON_FIELD = re.compile(r"[A-Za-z0-9*/,-]{1,40}", re.ASCII)


# Each field of a cron schedule as GitHub reads it: its name, its range, and the names it takes.
_CRON_FIELDS = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of the month", 1, 31, ()),
    ("month", 1, 12, ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")),
    ("day of the week", 0, 6, ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")),
)


def cron(value: str) -> str | None:
    """A POSIX cron schedule as GitHub reads it: five fields (minute hour day month weekday), each
    a list of ``*``, values, ranges and ``/steps`` within its field's range (GitHub refuses the
    workflow otherwise)."""
    fields = value.split(" ")
    if len(fields) != 5 or not all(CRON_FIELD.fullmatch(f) for f in fields):
        return f"{value!r} is not a cron schedule of five fields, such as '17 4 * * 1' (Mondays, 04:17 UTC)"
    for text, (name, low, high, names) in zip(fields, _CRON_FIELDS):
        if not all(_cron_item(item, low, high, names) for item in text.split(",")):
            shown = f"{low}-{high}" + (f" or {names[0]}-{names[-1]}" if names else "")
            return f"{value!r} is not a cron schedule: its {name} field {text!r} is not within {shown}"
    return None


def _cron_item(item: str, low: int, high: int, names: tuple[str, ...]) -> bool:
    """``*``, ``N``, ``N-M``, each with an optional ``/STEP`` (1 to the field's top), within range."""
    base, slash, step = item.partition("/")
    if slash and not (step.isdigit() and 1 <= int(step) <= high):
        return False
    if base == "*":
        return True
    first, dash, last = base.partition("-")

    def value(text: str) -> int | None:
        if text.isdigit():
            return int(text) if low <= int(text) <= high else None
        upper = text.upper()
        return names.index(upper) + low if upper in names else None

    a, b = value(first), value(last) if dash else value(first)
    return a is not None and b is not None and a <= b


def runner_label(value: str) -> str | None:
    ok = RUNNER_LABEL.fullmatch(value)
    return None if ok else f"{value!r} is not a runner label (letters, digits and _ . : / + = -)"


def secret_name(value: str) -> str | None:
    if SECRET_NAME.fullmatch(value):
        return None
    return f"{value!r} is not a secret name (letters, digits and _, not starting with a digit)"


def setup_python(value: str) -> str | None:
    """A ``python-version`` for actions/setup-python: 3.12, 3.12.4, 3.13t, pypy3.10."""
    return None if SETUP_PYTHON.fullmatch(value) else f"{value!r} is not a Python version such as 3.12"


def repo_path(value: str) -> str | None:
    """A file path as a workflow names it: no spaces, quotes, $, braces or newlines; not an option."""
    if not REPO_PATH.fullmatch(value) or value.startswith("-"):
        return f"{value!r} is not a plain path (letters, digits and _ . @ + = , ~ / -)"
    return None


def install_spec(value: str) -> str | None:
    """What ``pip install`` gets: '.', a path, 'fa-images==1.2', 'git+https://host/repo@tag'."""
    shown = repr(_logins_hidden(value))
    if not INSTALL_SPEC.fullmatch(value) or value.startswith("-"):
        return f"{shown} is not a pip install target (a path, a requirement or a URL; no spaces, quotes, $)"
    if _carries_login(value) or untrusted.masked(value) != value:
        return (
            f"{untrusted.masked(shown)} carries a credential (a login or a token in its query), and a generated "
            "file never holds one (let the job authenticate itself)"
        )
    return None


def git_tag(value: str) -> str | None:
    """A tag name as ``git check-ref-format`` takes it, in a conservative alphabet, and never
    one that starts with '-' (a command would read it as an option)."""
    bad = (
        not _GIT_TAG_CHARS.fullmatch(value)
        or value.startswith(("-", ".", "/"))
        or value.endswith((".", "/", ".lock"))
        or ".." in value
        or "//" in value
        or "/." in value
        or value == "@"
    )
    why = "is not a tag name (a git tag of letters, digits and _ . + / -; not starting with - . or /)"
    return f"{value!r} {why}" if bad else None


def cache_spec(value: str) -> str | None:
    """A buildx cache spec, ``key=value,key=value``: ``type=registry,ref=REG/cache,mode=max``."""
    if not CACHE_SPEC.fullmatch(value):
        return f"{_logins_hidden(value)!r} is not a cache spec such as type=registry,ref=REG/cache"
    secrets = sorted(k for k in {pair.partition("=")[0] for pair in value.split(",")} if _CACHE_SECRET_WORDS.search(k))
    if secrets or _carries_login(value):
        what = f"{secrets[0]}=" if secrets else "a URL with a login"
        return (
            f"holds {what}, and a generated file never holds a credential (buildx reads it from the job's environment)"
        )
    return None


def generated_value(value: str) -> str | None:
    """Any value a generated file carries as text: printable, one line, no expression."""
    if not value.isprintable():
        return f"{value!r} holds a control character (a newline would escape its line)"
    if "${" in value or "$(" in value or "`" in value:
        return f"{value!r} holds an expression ($, {{ }} or backticks); only fa-images writes those"
    return None


# --- values that reach a generated Slurm batch script ------------------------------------------
# An #SBATCH line is read by sbatch, the rest by bash: a name or a path is written bare, so it
# must be one word of a safe alphabet; free text (--setup) is written shell-quoted instead.
SLURM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", re.ASCII)
# sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
SLURM_TIME = re.compile(r"\d{1,6}(?::\d{2}){0,2}|\d{1,3}-\d{1,2}(?::\d{2}){0,2}", re.ASCII)
ABSOLUTE_PATH = re.compile(r"/[A-Za-z0-9_.@+=,~/-]{0,1023}", re.ASCII)
MAX_SHELL_TEXT = 4096


def slurm_name(value: str) -> str | None:
    """A partition or account name: letters, digits and _ . -, not starting with - or '.'."""
    return None if SLURM_NAME.fullmatch(value) else f"{value!r} is not a Slurm name (letters, digits and _ . -)"


def slurm_time(value: str) -> str | None:
    """A time limit as sbatch takes it: 90, 1:30:00, 2-00:00."""
    if SLURM_TIME.fullmatch(value):
        return None
    return f"{value!r} is not a Slurm time limit such as 90, 4:00:00 or 1-00:00"


def absolute_path(value: str) -> str | None:
    """A path every node names the same way: absolute, one word, no '..' step."""
    if not ABSOLUTE_PATH.fullmatch(value) or "/../" in f"{value}/":
        return f"{value!r} is not a plain absolute path (/ then letters, digits and _ . @ + = , ~ / -; no '..')"
    return None


def shell_text(value: str) -> str | None:
    """Free shell text the user means to run (``--setup``): one printable line, bounded.

    It is written shell-quoted into the script and run with ``eval``, so no character of it can
    change the script around it; what it runs is the user's own choice.
    """
    if len(value) > MAX_SHELL_TEXT:
        return f"is {len(value)} characters long; at most {MAX_SHELL_TEXT}"
    if not value.isprintable():
        return f"{value!r} holds a control character (write one line: 'module load cuda; source env/bin/activate')"
    return None
