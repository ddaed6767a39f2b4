"""Gets flash-attn's source: from a package index by version, or from a local sdist.

``pip download flash-attn`` cannot do this: preparing its metadata imports torch. So the
sdist is fetched by URL from the index's JSON simple API (PEP 691) and checked against
the sha256 the index publishes, and against a pinned sha256 when one is known.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import tarfile
import tempfile
import urllib.error
import zlib
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from . import simple_index, untrusted
from .errors import SourceError, UsageError

PYPI_SIMPLE = "https://pypi.org/simple"
# The earliest time a zip entry can hold (1980-01-01); wheel timestamps start no earlier.
ZIP_EPOCH = 315532800
# The setup.py shapes the build shim knows how to correct (see setup_shim.py).
SUPPORTED_FLASH_ATTN = SpecifierSet(">=2.5.0,<=2.8.3.post2")


@dataclass(frozen=True)
class SourceTree:
    """An unpacked sdist and what its setup.py is able to take from the environment."""

    path: Path
    version: str
    sdist: Path
    sha256: str
    honours_cuda_archs_env: bool  # FLASH_ATTN_CUDA_ARCHS: not in 2.6.x and older
    honours_local_version: bool  # FLASH_ATTN_LOCAL_VERSION
    # Whether its setup.py fetches nvcc and ptxas from NVIDIA's server for some CUDA versions.
    fetches_toolchain: bool = False
    # The sdist's newest member time: the wheel's timestamps (SOURCE_DATE_EPOCH), so that the
    # same inputs give the same wheel, byte for byte, when a build runs again.
    source_date_epoch: int = ZIP_EPOCH


def sha256_of(path: Path) -> str:
    """The sha256 of a regular file (a FIFO or device is refused: ``untrusted.UntrustedInput``)."""
    digest = hashlib.sha256()
    with untrusted.open_regular(path) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sdist_name(version: str) -> str:
    return f"flash_attn-{version}.tar.gz"


def check_supported(version: str, *, allow_untested: bool = False) -> None:
    try:
        parsed = Version(version)
    except InvalidVersion:
        raise UsageError(f"{version!r} is not a valid flash-attn version") from None
    if parsed not in SUPPORTED_FLASH_ATTN and not allow_untested:
        raise UsageError(
            f"flash-attn {version} is outside the versions fa-images can build correctly ({SUPPORTED_FLASH_ATTN})",
            hint="pass --allow-untested to try anyway; the build then fails loudly if its "
            "setup.py has a shape fa-images cannot correct",
        )


def _open(url: str, accept: str | None = None):
    """urlopen that sends the login of ``https://user:token@host/...`` as Basic auth, never in a log."""
    return untrusted.open_url(untrusted.url_request(url, {"Accept": accept} if accept else None))


def find_on_index(version: str, index_url: str = PYPI_SIMPLE) -> tuple[str, str]:
    """(download URL, sha256) of flash-attn's sdist for ``version`` on a simple index (PEP 691 or 503)."""
    project_url = index_url.rstrip("/") + "/flash-attn/"
    try:
        with _open(project_url, accept=simple_index.ACCEPT) as resp:
            body = untrusted.read_response(resp, url=project_url)
            page = simple_index.parse(body, resp.headers.get("Content-Type", ""), url=project_url)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise SourceError(f"cannot read {untrusted.shown_url(project_url)}: {exc}") from None
    wanted = sdist_name(version)
    for entry in page.files:
        if entry.filename == wanted:
            if not entry.sha256:
                raise SourceError(f"{untrusted.shown_url(project_url)} publishes no sha256 for {wanted}")
            return entry.url, entry.sha256
    raise SourceError(
        f"flash-attn {version} has no sdist on {untrusted.shown_url(index_url)}",
        hint=f"newest versions there: {', '.join((page.versions or page.sdist_versions('flash-attn'))[-8:]) or 'none'}",
    )


def download(url: str, dest: Path, sha256: str) -> Path:
    """Downloads to ``dest`` atomically: a failed or mismatched download leaves nothing behind."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, _open(url) as resp:
            untrusted.copy_response(resp, out, url=url, limit=MAX_SDIST, timeout=DOWNLOAD_TIMEOUT)
        verify_sha256(tmp, sha256, shown_as=dest.name)
        tmp.replace(dest)
    except (urllib.error.URLError, OSError, untrusted.UntrustedInput) as exc:
        raise SourceError(f"download of {untrusted.shown_url(url)} failed: {exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def verify_sha256(path: Path, expected: str, *, shown_as: str | None = None) -> str:
    return check_sha256(sha256_of(path), expected, shown_as=str(shown_as or path))


def check_sha256(actual: str, expected: str, *, shown_as: str) -> str:
    """``actual``, if it is the ``expected`` sha256: the one check every download gets."""
    if actual != expected.lower():
        raise SourceError(
            f"sha256 mismatch for {shown_as}: expected {expected}, got {actual}",
            hint="the file is corrupt or not the release it claims to be; delete it and fetch again",
        )
    return actual


def obtain_sdist(
    *,
    version: str | None,
    sdist: Path | None,
    dest_dir: Path,
    sha256: str | None = None,
    index_url: str = PYPI_SIMPLE,
    sources_dir: Path | None = None,
) -> tuple[Path, str]:
    """The sdist to build and its verified sha256.

    Order: an explicit ``sdist`` file; a file of the right name in ``sources_dir`` (put
    there on the host, so builds need no network and no credentials); the index.
    """
    try:
        if sdist is not None:
            if not os.path.lexists(sdist):
                raise UsageError(f"sdist {sdist} does not exist")
            return sdist, verify_sha256(sdist, sha256) if sha256 else sha256_of(sdist)
        assert version is not None
        if sources_dir is not None:
            local = sources_dir / sdist_name(version)
            if os.path.lexists(local):
                return local, verify_sha256(local, sha256) if sha256 else sha256_of(local)
    except untrusted.UntrustedInput as exc:  # a FIFO, a device, a directory
        raise SourceError(str(exc)) from None
    url, index_sha = find_on_index(version, index_url)
    if sha256 and sha256.lower() != index_sha.lower():
        raise SourceError(
            f"{untrusted.shown_url(index_url)} publishes sha256 {index_sha} for flash-attn {version}, "
            f"but {sha256} is pinned",
        )
    path = download(url, dest_dir / sdist_name(version), index_sha)
    return path, index_sha


# flash-attn's sdist is ~8 MB; these only stop an endless or hostile download.
MAX_SDIST = 1 << 30
DOWNLOAD_TIMEOUT = 3600.0
# flash-attn 2.8.3 unpacks to about 100 MB; this only stops a tar bomb from filling the disk.
MAX_UNPACKED = 4 << 30


def _member_name(name: str) -> str:
    """'./flash_attn-2.8.3/setup.py' -> 'flash_attn-2.8.3/setup.py' (``tar -C dir .`` writes './')."""
    while name.startswith("./"):
        name = name[2:]
    return "" if name == "." else name


def unpack(sdist: Path, dest_dir: Path, sha256: str) -> SourceTree:
    """Unpacks an sdist into ``dest_dir``, which must not exist yet, and reads what its setup.py supports."""
    root, newest = extract(sdist, dest_dir, marker="setup.py", what="sdist")
    setup_py = root / "setup.py"
    if not setup_py.is_file() or setup_py.is_symlink():
        raise SourceError(f"{sdist.name} has no setup.py; it is not a flash-attn sdist")
    text = setup_py.read_text(errors="replace")
    return SourceTree(
        path=root,
        version=read_version(root),
        sdist=sdist,
        sha256=sha256,
        honours_cuda_archs_env="FLASH_ATTN_CUDA_ARCHS" in text,
        honours_local_version="FLASH_ATTN_LOCAL_VERSION" in text,
        source_date_epoch=newest,
    )


def extract(archive: Path, dest_dir: Path, *, marker: str, what: str) -> tuple[Path, int]:
    """Unpacks a source archive (.tar, .tar.gz) into ``dest_dir``, which must not exist yet: (its
    root, the directory that holds ``marker``, at the top or under one directory; its newest
    member time, at least ZIP_EPOCH).

    Nothing is removed here: the archive lands in a directory made fresh for it, so no name
    inside it (``..``, an absolute path, a link) can reach a file that was there before.
    """
    try:
        dest_dir.mkdir(parents=True)
    except FileExistsError:
        raise SourceError(f"refusing to unpack into {dest_dir}: it already exists") from None
    try:
        raw = untrusted.open_regular(archive, what=what)  # a FIFO or device would be read forever
    except untrusted.UntrustedInput as exc:
        raise SourceError(str(exc)) from None
    try:
        tar = tarfile.open(fileobj=raw)  # noqa: SIM115  (closed by `with tar:` below; open errors differ)
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raw.close()
        raise SourceError(f"{archive.name} is not a readable .tar.gz: {exc}") from None
    try:
        with raw, tar:
            members = tar.getmembers()
            names = [n for n in (_member_name(m.name) for m in members) if n]
            size = sum(m.size for m in members)
            if size > MAX_UNPACKED:
                raise SourceError(
                    f"{archive.name} would unpack to {size >> 20} MiB; refusing (at most {MAX_UNPACKED >> 20})"
                )
            tops = {n.split("/")[0] for n in names}
            if marker in names:
                root = dest_dir
            elif len(tops) == 1 and tops != {".."} and f"{next(iter(tops))}/{marker}" in names:
                root = dest_dir / tops.pop()
            else:
                raise SourceError(f"{archive.name} is not a {what}: no {marker} at its top or under one directory")
            _safe_extract(tar, dest_dir)
            newest = max((int(m.mtime) for m in members), default=ZIP_EPOCH)
    except tarfile.TarError as exc:
        raise SourceError(f"{archive.name} cannot be unpacked safely: {exc}") from None
    except (OSError, EOFError, zlib.error) as exc:
        raise SourceError(f"{archive.name} is not a readable .tar.gz: {exc}") from None
    return root, max(newest, ZIP_EPOCH)


def _safe_extract(tar: tarfile.TarFile, dest_dir: Path) -> None:
    """Regular files and directories under ``dest_dir`` only: no links, devices or escapes."""
    for member in tar.getmembers():
        name = _member_name(member.name)
        if not (member.isfile() or member.isdir()):
            raise SourceError(f"refusing to unpack {member.name!r}: an sdist holds only files and directories")
        if name.startswith("/") or ".." in Path(name).parts:
            raise SourceError(f"refusing to unpack {member.name!r}: it points outside the source tree")
    if hasattr(tarfile, "data_filter"):  # Python >= 3.9.17 / 3.10.12 / 3.11.4: a second, independent check
        tar.extractall(dest_dir, filter="data")
    else:
        tar.extractall(dest_dir)


def read_version(source_dir: Path) -> str:
    """The version as setup.py computes it: ``__version__`` in flash_attn/__init__.py."""
    init = source_dir / "flash_attn" / "__init__.py"
    match = init.is_file() and re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", init.read_text(), re.MULTILINE)
    if not match:
        raise SourceError(f"cannot read __version__ from {init}; is this flash-attn's source?")
    return match.group(1)


def tar_sha256(path: Path) -> str:
    """The sha256 of the tar inside ``path`` (a .tar or .tar.gz), read at most MAX_UNPACKED bytes far."""
    try:
        with untrusted.open_regular(path, what="source archive") as raw:
            head = raw.read(2)
            raw.seek(0)
            stream = gzip.GzipFile(fileobj=raw) if head == b"\x1f\x8b" else raw
            digest, total = hashlib.sha256(), 0
            while chunk := stream.read(1 << 20):
                total += len(chunk)
                if total > MAX_UNPACKED:
                    raise SourceError(f"{path.name} unpacks past {MAX_UNPACKED >> 20} MiB; refusing")
                digest.update(chunk)
    except untrusted.UntrustedInput as exc:
        raise SourceError(str(exc)) from None
    except (OSError, EOFError, zlib.error) as exc:
        raise SourceError(f"{path.name} is not a readable .tar.gz: {exc}") from None
    return digest.hexdigest()
