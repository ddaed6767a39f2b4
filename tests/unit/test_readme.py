"""The README's and the guides' examples are the tool's real output: each `$ fa-images ...` of a
```console block in README.md or docs/*.md that runs offline without an engine is run, and what it
prints (and its exit code, where the block shows `echo $?`) must be what the page shows, exactly.

A console block right after a ```yaml block that starts with `matrix:` runs on that matrix, in a
temporary directory; `init` runs in an empty temporary directory; the rest run in the repository,
on its matrix.yaml and dockerfiles/. Claims in the prose that name the tool's facts (the keys of
`--dry-run --json`, torch's default CUDA) are checked against the tool and the compat table.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.version import Version

from fa_images.config import compat

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
# The README and its guides (docs/*.md): every page a user reads, each example of each run.
PAGES = {"README.md": README} | {f"docs/{p.name}": p.read_text() for p in sorted((REPO / "docs").glob("*.md"))}
EVERY_PAGE = "\n".join(PAGES.values())
# Commands that need no engine, no network and no GPU, and print the same on every machine.
OFFLINE = ("plan", "gpus", "render --check", "build --dry-run", "init", "pick")
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


@dataclass
class Example:
    page: str  # README.md or docs/NAME.md
    line: int  # of the command, in its page
    args: list[str]
    shown: str  # the output the page shows
    exit_code: int | None  # from a following `echo $?`, if any
    matrix: str | None  # the ```yaml matrix the block runs on, if any


def examples() -> list[Example]:
    return [example for page, text in PAGES.items() for example in examples_of(page, text)]


def examples_of(page: str, text: str) -> list[Example]:
    found: list[Example] = []
    blocks = list(BLOCK.finditer(text))
    for i, block in enumerate(blocks):
        if block.group(1) != "console":
            continue
        before = blocks[i - 1] if i else None
        between = text[before.end() : block.start()] if before else ""
        matrix = None
        if before and before.group(1) == "yaml" and before.group(2).startswith("matrix:") and not between.strip():
            matrix = before.group(2)
        first_line = text[: block.start(2)].count("\n") + 1
        lines = block.group(2).splitlines()
        for n, line in enumerate(lines):
            if not line.startswith("$ fa-images "):
                continue
            command = re.sub(r"\s{2,}#.*$", "", line[len("$ fa-images ") :]).strip()
            if not command.startswith(OFFLINE) or " --dist " in f" {command} ":  # --dist: a build's wheels
                continue
            output: list[str] = []
            exit_code = None
            for later in lines[n + 1 :]:
                if later.startswith("$ echo $?"):
                    exit_code = int(lines[lines.index(later) + 1])
                    break
                if later.startswith("$ "):
                    break
                output.append(later)
            found.append(
                Example(page, first_line + n, shlex.split(command), "\n".join(output).strip("\n"), exit_code, matrix)
            )
    return found


EXAMPLES = examples()


@pytest.fixture
def run(run_fa_images, monkeypatch: pytest.MonkeyPatch):
    """`fa-images ARGS` in ``cwd``, with no colour, as the pages show it."""
    monkeypatch.setenv("NO_COLOR", "1")
    return lambda args, cwd: run_fa_images(args, cwd=cwd)


def test_the_readme_shows_each_kind_of_offline_example() -> None:
    """The parser finds them: a README edit that hid them from this test would make it vacuous."""
    kinds = {" ".join(e.args[:2]) for e in EXAMPLES}
    assert {"init --target", "plan", "gpus --matrix", "render --check", "build --dry-run"} <= kinds, kinds
    assert sum(1 for e in EXAMPLES if e.matrix) >= 2  # the matrix error examples


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: f"{e.page}:{e.line}:{' '.join(e.args)[:50]}")
def test_a_readme_example_prints_what_the_readme_shows(example: Example, tmp_path: Path, run) -> None:
    cwd = REPO
    args, tail = example.args, None
    if example.matrix is not None:
        (tmp_path / "matrix.yaml").write_text(example.matrix)
        cwd = tmp_path
    elif example.args[0] == "init":
        # For a Python without torch, so what it chose is the table's newest, not this host's torch.
        cwd = tmp_path
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
        args = [*args, "--python", str(tmp_path / "bare" / "bin" / "python")]
    if args[-3:-1] == ["|", "tail"]:  # `... | tail -N`: the last N lines, as the shell gives them
        args, tail = args[:-3], int(args[-1].removeprefix("-"))
    proc = run(args, cwd)
    printed = (proc.stdout + proc.stderr).strip("\n")
    if tail is not None:
        printed = "\n".join(printed.splitlines()[-tail:])
    assert printed == example.shown, f"{example.page}:{example.line}: `fa-images {' '.join(example.args)}`"
    if example.exit_code is not None:
        assert proc.returncode == example.exit_code
    elif example.shown.startswith("error:"):
        assert proc.returncode == 2, proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
    if example.args[0] == "init":  # what it wrote plans, as its next step says
        assert run(["plan"], cwd).returncode == 0


def test_the_dry_run_json_keys_the_readme_names_are_there(run) -> None:
    said = re.search(r"`--dry-run --json` gives the same per entry \((.*?)\)\s*beside", EVERY_PAGE, re.S)
    assert said, "the README describes `--dry-run --json`"
    names = set(re.findall(r"`(\w+)`", said.group(1)))
    proc = run(["build", "--dry-run", "--json"], REPO)
    assert proc.returncode == 0, proc.stderr
    entry = json.loads(proc.stdout)[0]
    keys = set(entry)
    for value in entry.values():  # one level down: `build` and `from_stages` with their `stage` and `tag`
        for item in value if isinstance(value, list) else [value]:
            keys |= set(item) if isinstance(item, dict) else set()
    assert names and names <= keys, f"not in --dry-run --json: {sorted(names - keys)}"
    assert {"steps", "stages", "tags", "checks", "push"} <= names


def test_the_default_cuda_the_readme_names_is_the_tables() -> None:
    """'CUDA 12.8 for torch 2.10, CUDA 13.0 for 2.11 to 2.14.1, ...': every torch from the first
    named on, with the default CUDA the README gives it."""
    said = re.search(r"PyPI default variant \((CUDA .*?)\)", EVERY_PAGE, re.S)
    assert said, "the README names torch's default CUDA"
    table = compat.load()
    ranges = re.findall(r"CUDA (\d+\.\d+) for (?:torch )?([\d.]+)(?: to ([\d.]+))?", said.group(1))
    assert len(ranges) >= 2, said.group(1)

    def release_of(text: str) -> tuple[int, ...]:
        return Version(text).release

    def within(version: str, low: str, high: str) -> bool:
        v = release_of(version)
        return v[: len(release_of(low))] >= release_of(low) and v[: len(release_of(high))] <= release_of(high)

    first = ranges[0][1]
    for version, release in table.torch.items():
        if release_of(version)[: len(release_of(first))] < release_of(first):
            continue
        named = [cuda for cuda, low, high in ranges if within(version, low, high or low)]
        assert named == [release.default_cuda], f"torch {version}: the README says {named}"


def _anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as '-'."""
    return {
        re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"(?m)^#{1,6} (.+)$", text)
    }


def test_every_link_between_the_pages_reaches_a_file_and_a_heading() -> None:
    """The README split into guides: a link into another page, or to a heading, that went nowhere."""
    checked = 0
    for page, text in PAGES.items():
        here = (REPO / page).parent
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path = (here / target).resolve() if target else REPO / page
            assert path.exists(), f"{page}: a link to {target}, which does not exist"
            if anchor and path.suffix == ".md":
                assert anchor in _anchors(path.read_text()), f"{page}: no heading #{anchor} in {target or page}"
            checked += 1
    assert checked > 20  # the guides, results and sources the pages link to


def test_the_readme_is_short_and_names_every_guide() -> None:
    assert len(README.splitlines()) < 300
    guides = {p for p in PAGES if p.startswith("docs/")}
    assert guides >= {"docs/fleet.md", "docs/keeping-up.md", "docs/air-gapped.md", "docs/build-farms.md",
                      "docs/reference.md"}  # fmt: skip
    assert all(f"]({guide})" in README for guide in guides)
