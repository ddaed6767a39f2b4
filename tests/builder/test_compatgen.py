"""`fa-images compat refresh`, offline: recorded index responses served over real HTTP on 127.0.0.1.

The fixtures in tests/fixtures/index/ are PyPI's own answers, trimmed (see its README); the
wheel URLs in them are pointed at the local server when served, so the refresh runs its real
code path (PEP 691 JSON, PEP 658 metadata, HTTP range reads of a wheel) without the internet.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import re
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
import yaml
from fixtures.small_compat import TABLE
from packaging.specifiers import SpecifierSet

from fa_images.builder import simple_index
from fa_images.builder.settings import ARCH_CODES
from fa_images.builder.source import SUPPORTED_FLASH_ATTN
from fa_images.config import compat, compatgen, yamlfile
from fa_images.errors import EXIT_TABLE_CHANGED, UsageError

# The CUDA libraries of the recorded METADATA (tests/fixtures/index/), in the built-in table's layers.
LIBRARIES_251 = [
    [
        "nvidia-cublas-cu12==12.4.5.8",
        "nvidia-cuda-cupti-cu12==12.4.127",
        "nvidia-cuda-nvrtc-cu12==12.4.127",
        "nvidia-cuda-runtime-cu12==12.4.127",
        "nvidia-cufft-cu12==11.2.1.3",
        "nvidia-curand-cu12==10.3.5.147",
        "nvidia-cusolver-cu12==11.6.1.9",
        "nvidia-cusparse-cu12==12.3.1.170",
        "nvidia-nvjitlink-cu12==12.4.127",
        "nvidia-nvtx-cu12==12.4.127",
    ],
    ["nvidia-cudnn-cu12==9.1.0.70"],
    ["nvidia-nccl-cu12==2.21.5"],
]
LIBRARIES_2110 = [
    ["cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.2"],
    ["nvidia-cudnn-cu13==9.19.0.56"],
    ["nvidia-cusparselt-cu13==0.8.0"],
    ["nvidia-nccl-cu13==2.28.9"],
    ["nvidia-nvshmem-cu13==3.4.5"],
]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "index"
FILES_HOST = "https://files.pythonhosted.org"
TORCH_251 = "torch-2.5.1-cp313-cp313-manylinux1_x86_64.whl"


def small_wheel(metadata: str) -> bytes:
    """A wheel-shaped zip holding a recorded METADATA, for the range-read path."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("torch/__init__.py", "# " + "x" * 100_000)  # the directory is not at the start
        zf.writestr("torch-2.5.1.dist-info/METADATA", metadata)
        zf.writestr("torch-2.5.1.dist-info/RECORD", "")
    return buf.getvalue()


class IndexHandler(http.server.BaseHTTPRequestHandler):
    """PyPI's and the torch index's paths, answered from the recorded files; Range honoured."""

    routes: ClassVar[dict[str, bytes]] = {}
    requests: ClassVar[list[tuple[str, str | None]]] = []

    def do_GET(self) -> None:
        self.requests.append((self.path, self.headers.get("Range")))
        body = self.routes.get(self.path)
        if body is None:
            self.send_error(404)
            return
        status, ranged = 200, self.headers.get("Range")
        if ranged:
            start, _, end = ranged.removeprefix("bytes=").partition("-")
            if start == "":  # the last N bytes
                begin, stop = max(0, len(body) - int(end)), len(body)
            else:
                begin, stop = int(start), min(len(body), int(end) + 1 if end else len(body))
            body, status = body[begin:stop], 206
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def index() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), IndexHandler)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    torch_page = (FIXTURES / "pypi-torch.json").read_text().replace(FILES_HOST, base + "/files")
    routes = {
        "/simple/torch/": torch_page.encode(),
        "/simple/flash-attn/": (FIXTURES / "pypi-flash-attn.json").read_bytes(),
        "/whl/torch/": (FIXTURES / "torch-index.html").read_bytes(),
    }
    for url in re.findall(r'"url": "([^"]+)"', torch_page):
        recorded = FIXTURES / f"{url.rsplit('/', 1)[1]}.METADATA"
        if recorded.exists():
            routes[url.removeprefix(base)] = small_wheel(recorded.read_text())
    IndexHandler.routes, IndexHandler.requests = routes, []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield base
    server.shutdown()
    server.server_close()


@pytest.fixture
def table(tmp_path: Path) -> Path:
    path = tmp_path / "compat.yaml"
    path.write_text(TABLE)
    return path


def refresh(table: Path, base: str, **kwargs) -> compatgen.Refresh:
    return compatgen.refresh(table, pypi=f"{base}/simple", torch_index=f"{base}/whl", **kwargs)


def test_refresh_reads_releases_pythons_default_cuda_and_variants(index: str, table: Path) -> None:
    result = refresh(table, index)
    table.write_text(result.text)
    torch = compat.load(table).torch  # the built-in table with this one merged: what plan would see
    new = yaml.safe_load(result.text)["torch"]
    assert list(new) == ["2.5.1", "2.9.1", "2.11.0"]
    # Pythons: cpXY manylinux x86_64 wheels only (no cp313t, no macOS).
    assert new["2.5.1"]["python"] == ["3.9", "3.10", "3.12", "3.13"]
    assert new["2.11.0"]["python"] == ["3.10", "3.12", "3.13", "3.14"]
    # Default CUDA from each wheel's METADATA: old "(==12.4.127)", "==12.8.90", "cuda-toolkit[...]==13.0.2".
    assert [new[v]["default_cuda"] for v in new] == ["12.4", "12.8", "13.0"]
    # Variants from the torch index; ABI kept from the table where known, else the rule. The
    # default variant's CUDA libraries from the same METADATA, in the built-in table's layers
    # (old "(==9.1.0.70)" pins; cuda-toolkit[...] for the toolkit's own from 2.11).
    assert new["2.5.1"]["cuda"] == {
        "11.8": {"cxx11_abi": False},
        "12.1": {"cxx11_abi": False},
        "12.4": {"cxx11_abi": False, "libraries": LIBRARIES_251},
    }
    assert new["2.11.0"]["cuda"]["13.0"]["libraries"] == LIBRARIES_2110
    variant = torch["2.11.0"].variant("13.0")  # as plan reads it
    assert variant is not None and variant.libraries[1] == ("nvidia-cudnn-cu13==9.19.0.56",)
    assert set(new["2.11.0"]["cuda"]) == {"12.6", "12.8", "13.0"}
    assert all(v["cxx11_abi"] for v in new["2.11.0"]["cuda"].values())
    assert torch["2.11.0"].default_cuda == "13.0"
    # torch 2.5.1's wheel has no .metadata file: its METADATA came by range requests, not a download.
    ranges = [r for p, r in IndexHandler.requests if p.endswith(TORCH_251) and r]
    assert ranges and ranges[0] == "bytes=-65536"
    assert not any(p.endswith(TORCH_251) and r is None for p, r in IndexHandler.requests)
    assert "torch 2.11.0: added (CUDA 12.6, 12.8, 13.0; default 13.0; Python 3.10, 3.12, 3.13, 3.14)" in (
        result.diff.lines()
    )
    assert (
        "torch 2.5.1: CUDA 11.8, 12.1 added; the CUDA libraries of CUDA 12.4 changed; Python 3.10, 3.12, 3.13 added"
        in result.diff.lines()
    )


def test_refresh_keeps_comments_and_hand_written_sections(index: str, table: Path) -> None:
    text = refresh(table, index).text
    assert text.startswith('pythons: ["3.9"')
    assert "# BEGIN generated torch\ntorch:\n" in text and "# END generated flash_attn\n" in text
    assert (
        text.split("# END generated torch\n")[1].split("# BEGIN generated flash_attn")[0]
        == (TABLE.split("# END generated torch\n")[1].split("# BEGIN generated flash_attn")[0])
    )


def test_refresh_adds_newer_flash_attn_with_sha256_from_pypi(index: str, table: Path) -> None:
    result = refresh(table, index)
    flash = yaml.safe_load(result.text)["flash_attn"]
    assert list(flash) == ["2.8.2", "2.8.3", "2.8.3.post1", "2.8.3.post2"]
    assert flash["2.8.3"]["sha256"] == "1e71dd64a9e0280e0447b8a0c2541bad4bf6ac65bdeaa2f90e51a9e57de0370d"
    assert "flash-attn 2.8.3.post2: added" in result.diff.lines()
    assert [r.version for r in result.diff.flash_attn_added] == ["2.8.3", "2.8.3.post1", "2.8.3.post2"]


def test_refresh_refuses_a_changed_sdist_hash(index: str, table: Path) -> None:
    table.write_text(TABLE.replace("740a5370", "00000000"))
    with pytest.raises(UsageError, match=r"flash-attn 2\.8\.2: PyPI publishes sha256 740a5370"):
        refresh(table, index)


def test_unreachable_torch_index_keeps_the_table_variants(index: str, table: Path) -> None:
    result = compatgen.refresh(table, pypi=f"{index}/simple", torch_index=f"{index}/nowhere")
    new = yaml.safe_load(result.text)["torch"]
    assert new["2.5.1"]["cuda"] == {"12.4": {"cxx11_abi": False, "libraries": LIBRARIES_251}}  # the table's variant
    assert list(new["2.11.0"]["cuda"]) == ["13.0"]  # PyPI's default only
    assert any(n.startswith("torch index not reached") for n in result.notes)


def test_cli_refresh_writes_a_valid_table(index: str, table: Path, run_fa_images, tmp_path: Path) -> None:
    out = tmp_path / "new.yaml"
    args = ["compat", "refresh", "--table", table, "--out", out]
    proc = run_fa_images([*args, "--pypi", f"{index}/simple", "--torch-index", f"{index}/whl"])
    assert proc.returncode == EXIT_TABLE_CHANGED, proc.stderr
    assert f"wrote {out}" in proc.stdout
    assert "2.11.0" in compat.load(out).torch
    bad = run_fa_images([*args, "--pypi", "https://pypi.example/simple;rm -rf /"])
    assert bad.returncode == 2 and bad.stderr.startswith("error: --pypi ")
    assert "Traceback" not in bad.stderr
    down = run_fa_images([*args, "--pypi", f"{index}/nothing-here"])
    assert down.returncode == 2 and down.stderr.startswith(f"error: cannot refresh from {index}/nothing-here")
    assert "Traceback" not in down.stderr


# --- what a refresh changed: the diff, its JSON and the exit code CI acts on --------------------


def hide_release(version: str) -> None:
    """The index as it was before ``version`` was published: gone from PyPI's page and the torch index."""
    page = json.loads(IndexHandler.routes["/simple/torch/"])
    page["files"] = [f for f in page["files"] if not f["filename"].startswith(f"torch-{version}-")]
    page["versions"] = [v for v in page["versions"] if v != version]
    IndexHandler.routes["/simple/torch/"] = json.dumps(page).encode()
    html = IndexHandler.routes["/whl/torch/"].decode().splitlines(keepends=True)
    IndexHandler.routes["/whl/torch/"] = "".join(x for x in html if f"torch-{version}%2B" not in x).encode()


def cli_refresh(run_fa_images, table: Path, index: str, *flags: str):
    return run_fa_images(
        ["compat", "refresh", "--table", table, "--pypi", f"{index}/simple", "--torch-index", f"{index}/whl", *flags]
    )


def test_a_release_the_index_gains_is_reported_as_a_change(index: str, table: Path, run_fa_images) -> None:
    """The loop CI runs: refresh, nothing new (exit 0), a torch release published, refresh (exit 10)."""
    published = dict(IndexHandler.routes)
    hide_release("2.11.0")
    first = cli_refresh(run_fa_images, table, index)
    assert first.returncode == EXIT_TABLE_CHANGED, first.stderr
    lines = first.stdout.splitlines()
    assert "torch 2.9.1: added (CUDA 12.6, 12.8, 13.0; default 12.8; Python 3.10, 3.12, 3.13, 3.14)" in lines
    assert (
        "torch 2.5.1: CUDA 11.8, 12.1 added; the CUDA libraries of CUDA 12.4 changed; Python 3.10, 3.12, 3.13 added"
        in lines
    )
    assert "flash-attn 2.8.3: added" in lines and "2.11.0" not in first.stdout
    assert lines[-2:] == [
        "changed: torch releases: 1 added, 1 updated; flash-attn sdists: 3 added",
        f"wrote {table}",
    ]

    same = cli_refresh(run_fa_images, table, index)
    assert same.returncode == 0, same.stderr
    assert same.stdout.splitlines() == [
        "no change: the same torch releases and flash-attn sdists as the table",
        f"wrote {table}",
    ]

    IndexHandler.routes = published  # torch 2.11.0 is published
    gained = cli_refresh(run_fa_images, table, index, "--json")
    assert gained.returncode == EXIT_TABLE_CHANGED, gained.stderr
    report = json.loads(gained.stdout)
    assert report["changed"] is True and report["wrote"] == str(table) and report["notes"] == []
    assert report["torch"]["added"] == [
        {
            "version": "2.11.0",
            "python": ["3.10", "3.12", "3.13", "3.14"],
            "default_cuda": "13.0",
            "cuda": {
                "12.6": {"cxx11_abi": True},
                "12.8": {"cxx11_abi": True},
                "13.0": {"cxx11_abi": True, "libraries": LIBRARIES_2110},
            },
        }
    ]
    assert report["torch"]["removed"] == report["torch"]["updated"] == []
    assert report["flash_attn"] == {"added": [], "removed": [], "updated": []}
    assert "2.11.0" in compat.load(table).torch  # written, as plan reads it

    again = cli_refresh(run_fa_images, table, index, "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["changed"] is False


def test_help_names_the_exit_code_of_a_change(run_fa_images) -> None:
    text = " ".join(run_fa_images(["compat", "refresh", "--help"]).stdout.split())
    assert f"0 written, no release changed; {EXIT_TABLE_CHANGED} written, and some changed" in text
    assert "--json" in text


def _table(text: str) -> compat.Compat:
    return compat.build(yamlfile.parse(text.encode(), shown="compat.yaml", what="compat table"))


def test_the_diff_names_what_was_removed_and_updated() -> None:
    """A refresh adds and keeps; the diff compares the two tables, so it names any change they show."""
    before = _table(
        TABLE.replace(
            "# END generated torch\n",
            '  "2.4.1": {python: ["3.9"], default_cuda: "12.1", cuda: {"12.1": {cxx11_abi: false}}}\n'
            "# END generated torch\n",
        )
    )
    after = _table(
        TABLE.replace('python: ["3.9"]', 'python: ["3.10"]')
        .replace('default_cuda: "12.4"', 'default_cuda: "12.6"')
        .replace('"12.4": {cxx11_abi: false}', '"12.4": {cxx11_abi: true}\n      "12.6": {cxx11_abi: true}')
        .replace("cuda_archs_env: true", "cuda_archs_env: false")
    )
    diff = compatgen.table_diff(before, after)
    assert diff.changed and diff.lines() == [
        "torch 2.4.1: removed",
        "torch 2.5.1: CUDA 12.6 added; the C++ ABI of CUDA 12.4 changed; Python 3.10 added; Python 3.9 removed; "
        "default CUDA 12.4 -> 12.6",
        "flash-attn 2.8.2: cuda_archs_env True -> False",
        "changed: torch releases: 1 removed, 1 updated; flash-attn sdists: 1 updated",
    ]
    report = diff.as_json()
    assert [r["version"] for r in report["torch"]["removed"]] == ["2.4.1"]
    assert report["torch"]["updated"] == [
        {
            "version": "2.5.1",
            "cuda_added": ["12.6"],
            "abi_changed": ["12.4"],
            "python_added": ["3.10"],
            "python_removed": ["3.9"],
            "default_cuda": {"before": "12.4", "after": "12.6"},
        }
    ]
    assert report["flash_attn"]["updated"][0]["after"]["cuda_archs_env"] is False
    assert not compatgen.table_diff(after, after).changed
    assert compatgen.table_diff(after, after).lines() == [
        "no change: the same torch releases and flash-attn sdists as the table"
    ]


FLASH_ATTN_PAGE = (FIXTURES / "pypi-flash-attn.json").read_bytes()
HOSTILE_PAGES = {  # (route, what the index serves there)
    "not UTF-8": ("/simple/torch/", b'{"files": "\xff\xfe"}'),
    "nested 100,000 deep": ("/simple/torch/", b"[" * 100_000 + b"]" * 100_000),
    "files that are a string": ("/simple/torch/", b'{"meta": {"api-version": "1.0"}, "files": "all of them"}'),
    "JSON null": ("/simple/torch/", b"null"),
    "a pinned sdist's sha256 replaced": (
        "/simple/flash-attn/",
        FLASH_ATTN_PAGE.replace(b"740a5370f406cbe16155cc6d078ec543", b"0" * 32),
    ),
    "a terminal escape in a pinned sdist's sha256": (
        "/simple/flash-attn/",
        FLASH_ATTN_PAGE.replace(b"740a5370f406cbe16155cc6d078ec543", b"\\u001b[2J" + b"0" * 28),
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_PAGES))
@pytest.mark.parametrize("as_json", [False, True])
def test_a_hostile_index_page_is_one_error_line_with_or_without_json(
    case: str, as_json: bool, index: str, table: Path, run_fa_images
) -> None:
    before = table.read_text()
    route, body = HOSTILE_PAGES[case]
    IndexHandler.routes[route] = body
    proc = cli_refresh(run_fa_images, table, index, *(["--json"] if as_json else []))
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout == "" and "\x1b" not in proc.stderr
    assert table.read_text() == before, "nothing written"


@pytest.mark.parametrize(
    ("line", "cuda"),
    [
        ('Requires-Dist: nvidia-cuda-runtime-cu12 (==12.4.127) ; platform_system == "Linux"', "12.4"),
        ('Requires-Dist: nvidia-cuda-runtime-cu12==12.8.90; platform_system == "Linux"', "12.8"),
        ('Requires-Dist: cuda-toolkit[cublas,cudart]==13.0.2; platform_system == "Linux"', "13.0"),
        ("Requires-Dist: filelock", None),
    ],
)
def test_default_cuda_of_metadata(line: str, cuda: str | None) -> None:
    assert compatgen.default_cuda_of(f"Name: torch\n{line}\n") == cuda


@pytest.mark.parametrize(
    ("filename", "found"),
    [
        ("torch-2.9.1-cp311-cp311-manylinux_2_28_x86_64.whl", ("2.9.1", "311")),
        # A re-upload with a build tag, as PyPI holds for 2.10.0 and pip downloads first.
        ("torch-2.10.0-3-cp311-cp311-manylinux_2_28_x86_64.whl", ("2.10.0", "311")),
        ("torch-2.9.1%2Bcu128-cp312-cp312-manylinux_2_28_x86_64.whl", None),  # quoted: not a name
        ("torch-2.9.1+cu128-cp312-cp312-manylinux_2_28_x86_64.whl", ("2.9.1+cu128", "312")),
        ("torch-2.5.1-cp313-cp313t-manylinux1_x86_64.whl", None),  # free-threaded
        ("torch-2.9.1-cp311-cp311-manylinux_2_28_aarch64.whl", None),
        ("torch-2.9.1-cp311-none-macosx_11_0_arm64.whl", None),
        ("torchvision-0.24.1-cp311-cp311-manylinux_2_28_x86_64.whl", None),
        ("torch-2.9.1-cp311-cp311-manylinux_2_28_x86_64.tar.gz", None),
        ("torch-not.a.version-cp311-cp311-manylinux_2_28_x86_64.whl", None),
    ],
)
def test_torch_wheels_are_read_by_the_wheel_name_grammar(filename: str, found: tuple[str, str] | None) -> None:
    assert compatgen._linux_torch_wheel(filename) == found


def test_abi_rule() -> None:
    assert [compatgen.abi_rule(t, c) for t, c in [("2.5.1", "12.4"), ("2.6.0", "12.4"), ("2.6.0", "12.6")]] == [
        False,
        False,
        True,
    ]
    assert compatgen.abi_rule("2.7.0", "11.8") and compatgen.abi_rule("2.11.0", "13.0")


# --- the table is the source; the builder's copies must agree ----------------------------------


def test_builder_arch_codes_equal_the_table() -> None:
    assert set(compat.load().arch_codes) == set(ARCH_CODES)


def test_builder_flash_attn_range_equals_the_table() -> None:
    assert compat.load().flash_attn_range == SpecifierSet(str(SUPPORTED_FLASH_ATTN))


def test_every_table_python_has_tool_pins_that_support_it() -> None:
    """setuptools 83+ needs Python >= 3.10: cp39 gets its own pin from the table."""
    table = compat.load()
    assert "setuptools==82.0.1" in table.tools_for("3.9")
    assert table.tools_for("3.11") == table.build_tools
    assert all(any(p.startswith("setuptools==") for p in table.tools_for(py)) for py in table.pythons)


TORCH_2110 = "torch-2.11.0-cp314-cp314-manylinux_2_28_x86_64.whl"
RECORDED_2110 = FIXTURES / f"{TORCH_2110}.METADATA"


def test_a_pep_658_metadata_file_is_used_before_any_range_request(index: str) -> None:
    """Where the index announces and serves ``<wheel>.metadata``, the wheel itself is never touched."""
    wheel = next(p for p in IndexHandler.routes if p.endswith(TORCH_2110))
    IndexHandler.routes[wheel + ".metadata"] = RECORDED_2110.read_bytes()
    sha = hashlib.sha256(RECORDED_2110.read_bytes()).hexdigest()
    announced = simple_index.File(TORCH_2110, index + wheel, None, metadata=(("sha256", sha),))
    assert compatgen.wheel_metadata(compatgen.http_fetch, announced) == RECORDED_2110.read_text()
    assert [r for p, r in IndexHandler.requests if p == wheel] == []


def serve_torch_page(form: str, key: str, value: object, metadata: bytes | None) -> None:
    """The torch page again, announcing a ``.metadata`` for torch 2.11.0's newest wheel with
    ``value`` under ``key`` (the JSON value; the HTML attribute gets its PEP 658 text), in PEP 691
    JSON or PEP 503 HTML; ``metadata`` is what the index serves as that file."""
    page = json.loads(IndexHandler.routes["/simple/torch/"])
    wheel = next(f for f in page["files"] if f["filename"] == TORCH_2110)
    base = wheel["url"].split("/files/")[0]
    if metadata is not None:
        IndexHandler.routes[wheel["url"].removeprefix(base) + ".metadata"] = metadata
    if form == "json":
        wheel[key] = value
        IndexHandler.routes["/simple/torch/"] = json.dumps(page).encode()
        return
    assert value is True or isinstance(value, dict)
    text = "true" if value is True else ",".join(f"{k}={v}" for k, v in value.items())
    anchors = [
        f'<a href="{f["url"]}#sha256={f["hashes"]["sha256"]}"'
        + (f' data-{key}="{text}"' if f is wheel else "")
        + f">{f['filename']}</a><br>"
        for f in page["files"]
    ]
    IndexHandler.routes["/simple/torch/"] = ("<html><body>\n" + "\n".join(anchors) + "\n</body></html>").encode()


FORMS = [
    ("json", "core-metadata"),
    ("json", "dist-info-metadata"),
    ("html", "core-metadata"),
    ("html", "dist-info-metadata"),
]


def _wheel_requests(kind: str) -> list[tuple[str, str | None]]:
    suffix = TORCH_2110 + (".metadata" if kind == "metadata" else "")
    return [(p, r) for p, r in IndexHandler.requests if p.endswith(suffix)]


@pytest.mark.parametrize(("form", "key"), FORMS)
def test_an_announced_metadata_file_is_checked_against_its_hash(form: str, key: str, index: str, table: Path) -> None:
    sha = hashlib.sha256(RECORDED_2110.read_bytes()).hexdigest()
    serve_torch_page(form, key, {"sha256": sha}, RECORDED_2110.read_bytes())
    new = yaml.safe_load(refresh(table, index).text)["torch"]
    assert new["2.11.0"]["default_cuda"] == "13.0"
    assert _wheel_requests("metadata") and _wheel_requests("wheel") == []  # no range read of the wheel


@pytest.mark.parametrize(("form", "key"), FORMS)
def test_a_metadata_file_that_is_not_the_announced_one_is_refused(
    form: str, key: str, index: str, table: Path, run_fa_images, tmp_path: Path
) -> None:
    forged = RECORDED_2110.read_bytes().replace(b"cuda-toolkit", b"cuda-toolkiT")
    serve_torch_page(form, key, {"sha256": hashlib.sha256(RECORDED_2110.read_bytes()).hexdigest()}, forged)
    with pytest.raises(UsageError, match=rf"sha256 mismatch for {re.escape(TORCH_2110)}\.metadata"):
        refresh(table, index)
    out = tmp_path / "new.yaml"
    proc = run_fa_images(
        [
            "compat",
            "refresh",
            "--table",
            table,
            "--out",
            out,
            "--pypi",
            f"{index}/simple",
            "--torch-index",
            f"{index}/whl",
        ]
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: sha256 mismatch for {TORCH_2110}.metadata"), proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.startswith("error:")]) == 1
    assert "Traceback" not in proc.stderr and not out.exists()


@pytest.mark.parametrize("form", ["json", "html"])
def test_metadata_announced_without_a_hash_is_used_as_pip_uses_it(form: str, index: str, table: Path) -> None:
    serve_torch_page(form, "core-metadata", True, RECORDED_2110.read_bytes())
    assert yaml.safe_load(refresh(table, index).text)["torch"]["2.11.0"]["default_cuda"] == "13.0"
    assert _wheel_requests("metadata") and _wheel_requests("wheel") == []


@pytest.mark.parametrize("form", ["json", "html"])
def test_a_hash_of_another_algorithm_only_is_refused(form: str, index: str, table: Path) -> None:
    serve_torch_page(form, "core-metadata", {"md5": "0" * 32}, RECORDED_2110.read_bytes())
    with pytest.raises(UsageError, match=rf"{re.escape(TORCH_2110)}\.metadata: the index announces it with a md5 hash"):
        refresh(table, index)
    assert _wheel_requests("metadata") == []  # refused before it was fetched


def test_metadata_not_announced_is_read_from_the_wheel(index: str, table: Path) -> None:
    """PEP 658: a client fetches ``.metadata`` only where the page announces it."""
    refresh(table, index)
    assert _wheel_requests("metadata") == [] and _wheel_requests("wheel")


# --- where a refresh writes: never into the installed package --------------------------------------


def test_a_refresh_of_the_built_in_table_writes_beside_the_user_never_into_the_package(
    index: str, table: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The built-in table (here the small one of these tests, as it) is read; ./compat.yaml is
    written, or the file the matrix's compat: names; the table read is left as it was."""
    from fa_images import cli

    monkeypatch.setattr(compat, "DEFAULT_FILE", table)
    work = tmp_path / "work"
    (work / "team").mkdir(parents=True)
    monkeypatch.chdir(work)
    flags = ["--pypi", f"{index}/simple", "--torch-index", f"{index}/whl", "--json"]
    assert cli.main(["compat", "refresh", *flags]) == EXIT_TABLE_CHANGED
    assert json.loads(capsys.readouterr().out)["wrote"] == "compat.yaml"
    assert "2.11.0" in compat.load(work / "compat.yaml").torch and table.read_text() == TABLE
    (work / "team" / "matrix.yaml").write_text("compat: ours.yaml\nentries: []\n")
    assert cli.main(["compat", "refresh", "--matrix", "team/matrix.yaml", *flags]) == EXIT_TABLE_CHANGED
    assert json.loads(capsys.readouterr().out)["wrote"] == str(work / "team" / "ours.yaml")
    assert "2.11.0" in compat.load(work / "team" / "ours.yaml").torch


def test_an_out_inside_the_installed_package_is_refused_before_any_index_is_asked(
    index: str, table: Path, run_fa_images
) -> None:
    inside = Path(compat.__file__).resolve().parent / "compat.yaml"
    before = inside.read_bytes()
    proc = run_fa_images(["compat", "refresh", "--out", inside, "--pypi", f"{index}/simple"])
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: --out {inside} is inside fa-images's installed")
    assert IndexHandler.requests == [] and inside.read_bytes() == before
