"""``fa-images wheel --prepare-only``: fetch, unpack and settle the settings, without compiling.

Runs the CLI as a user would (a subprocess of this Python, which has a CPU build of torch)
on the real flash-attn sdists, and against a local PEP 691 index served by http.server.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from fixtures.tiny import make_tiny_sdist

# What each real setup.py can take from the environment (the spec, read from the
# releases): 2.6.x hard-codes -gencode for 80 and 90; 2.7 added FLASH_ATTN_CUDA_ARCHS.
HONOURS_CUDA_ARCHS_ENV = {"2.6.3": False, "2.7.4.post1": True, "2.8.3": True}
PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def assert_one_clear_error(proc: subprocess.CompletedProcess[str], exit_code: int, *needles: str) -> str:
    """Exit code as documented, one ``error:`` line holding every needle, no traceback."""
    assert proc.returncode == exit_code, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = error_lines(proc.stderr)
    assert len(errors) == 1, proc.stderr
    for needle in needles:
        assert needle in errors[0], proc.stderr
    return errors[0]


# --- the real sdists ---------------------------------------------------------------------


@dataclass
class Prepared:
    version: str
    sdist: Path
    work: Path
    proc: subprocess.CompletedProcess[str]

    @property
    def settings(self) -> dict:
        return json.loads(self.proc.stdout)


@pytest.fixture(scope="module", params=sorted(HONOURS_CUDA_ARCHS_ENV))
def prepared(request, real_sdist, run_fa_images, tmp_path_factory, prepare_only) -> Prepared:
    version = request.param
    sdist = real_sdist(version)
    work = tmp_path_factory.mktemp(f"prepare-{version}")
    proc = run_fa_images(
        prepare_only("--archs", "90,8.0", sdist=sdist, out=work / "dist", work=work, keep_work=True, json=True)
    )
    return Prepared(version, sdist, work, proc)


def test_prepare_real_sdist_prints_its_settings(prepared: Prepared, system_torch: dict) -> None:
    assert prepared.proc.returncode == 0, prepared.proc.stderr
    s = prepared.settings  # stdout is exactly one JSON document
    assert s["flash_attn"] == prepared.version
    assert s["python"] == PYTHON
    assert s["torch"] == system_torch["version"]
    assert s["cuda"] is None and system_torch["cuda"] is None
    assert s["cxx11_abi"] is system_torch["abi"]
    assert s["archs"] == ["80", "90"]
    assert s["ptx"] is False
    assert isinstance(s["max_jobs"], int) and 1 <= s["max_jobs"] <= (os.cpu_count() or 1)
    assert s["nvcc_threads"] == 2  # two archs: one nvcc thread each
    assert "2 gencode targets per kernel" in s["parallelism"]
    assert s["sdist"] == str(prepared.sdist)
    assert s["sha256"] == sha256_file(prepared.sdist)
    assert s["honours_cuda_archs_env"] is HONOURS_CUDA_ARCHS_ENV[prepared.version]
    mm = ".".join(system_torch["version"].split("+")[0].split(".")[:2])
    assert s["local_version"] == f"cputorch{mm}cxx11abi{str(system_torch['abi']).lower()}"


def test_prepare_unpacks_the_source_and_writes_the_settings_file(prepared: Prepared) -> None:
    assert prepared.proc.returncode == 0, prepared.proc.stderr
    source_dir = Path(prepared.settings["source_dir"])
    assert source_dir.is_dir()
    scratch = source_dir.parent.parent  # --keep-work kept the scratch dir made under --work-dir
    assert scratch.parent == prepared.work and scratch.name.startswith("fa-images-wheel-")
    assert source_dir.parent == scratch / "src"
    assert (source_dir / "setup.py").is_file()
    assert f'__version__ = "{prepared.version}"' in (source_dir / "flash_attn" / "__init__.py").read_text()
    settings_file = source_dir / "fa_images_build.json"
    assert json.loads(settings_file.read_text()) == prepared.settings


def test_prepare_warns_that_torch_is_a_cpu_build(prepared: Prepared, system_torch: dict) -> None:
    assert prepared.proc.returncode == 0, prepared.proc.stderr
    warnings = [line for line in prepared.proc.stderr.splitlines() if line.startswith("warning:")]
    assert any(f"torch {system_torch['version']} is a CPU build" in w for w in warnings), prepared.proc.stderr
    assert prepared.settings["warnings"], "the warning must also be in the settings"
    assert "Traceback" not in prepared.proc.stderr


def test_prepare_takes_overrides(run_fa_images, tmp_path: Path, prepare_only) -> None:
    sdist = make_tiny_sdist(tmp_path / "in", version="2.8.3")
    proc = run_fa_images(
        prepare_only(
            "--archs",
            "sm_90;80",
            "--ptx",
            "--max-jobs",
            "3",
            "--nvcc-threads",
            "1",
            sdist=sdist,
            out=tmp_path / "dist",
            work=tmp_path,
            json=True,
        )
    )
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    assert (s["archs"], s["ptx"], s["max_jobs"], s["nvcc_threads"]) == (["80", "90"], True, 3, 1)


def test_prepare_without_json_names_the_kept_source_dir(run_fa_images, tmp_path: Path, prepare_only) -> None:
    sdist = make_tiny_sdist(tmp_path / "in", version="2.8.3")
    work = tmp_path / "work"
    args = prepare_only(sdist=sdist, out=tmp_path / "dist", work=work)
    for extra in ([], ["--keep-work"]):  # --prepare-only keeps it, with --keep-work or without
        before = set(work.iterdir()) if work.exists() else set()
        proc = run_fa_images([*args, *extra])
        assert proc.returncode == 0, proc.stderr
        (scratch,) = set(work.iterdir()) - before
        assert proc.stdout.strip() == f"prepared {scratch / 'src' / 'flash_attn-2.8.3'}"
        assert (scratch / "src" / "flash_attn-2.8.3" / "setup.py").is_file()
        assert proc.stderr.count(f"kept the work dir: {scratch} (the prepared source and its sdist") == 1


def test_prepare_only_json_names_paths_that_exist(run_fa_images, tmp_path: Path, prepare_only) -> None:
    """Issue 30: `--prepare-only --json` named a source_dir in a temp dir it had already removed."""
    sdist = make_tiny_sdist(tmp_path / "in", version="2.8.3")
    proc = run_fa_images(prepare_only(sdist=sdist, out=tmp_path / "dist", work=tmp_path / "work", json=True))
    assert proc.returncode == 0, proc.stderr
    settings = json.loads(proc.stdout)
    source_dir = Path(settings["source_dir"])
    assert (source_dir / "setup.py").is_file() and (source_dir / "fa_images_build.json").is_file()
    assert Path(settings["sdist"]).is_file()
    assert f"kept the work dir: {source_dir.parent.parent} " in proc.stderr


def test_prepare_with_a_compiler_cache_in_a_work_dir_of_its_own(run_fa_images, tmp_path: Path, prepare_only) -> None:
    """The compile RUN plus --prepare-only, as the Python 3.9 stage test runs it: the source is
    prepared under the cache's fixed name, which is kept, and a second prepare there is refused."""
    sdist = make_tiny_sdist(tmp_path / "in", version="2.8.3")
    work = tmp_path / "work"
    cache = tmp_path / "cache"
    args = prepare_only("--compiler-cache", cache, sdist=sdist, out=tmp_path / "dist", work=work, json=True)
    proc = run_fa_images(args)
    assert proc.returncode == 0, proc.stderr
    source_dir = Path(json.loads(proc.stdout)["source_dir"])
    assert source_dir == work / "fa-images-wheel-cached" / "src" / "flash_attn-2.8.3"
    assert (source_dir / "setup.py").is_file()
    again = run_fa_images(args)
    assert_one_clear_error(again, 2, "fa-images-wheel-cached exists")
    assert (source_dir / "setup.py").is_file(), "the refused run must leave the kept source alone"


def test_sha256_mismatch_of_a_local_sdist(real_sdist, run_fa_images, tmp_path: Path, prepare_only) -> None:
    sdist = real_sdist("2.8.3")
    wrong = "0" * 64
    proc = run_fa_images(prepare_only("--sha256", wrong, sdist=sdist, out=tmp_path / "dist", work=tmp_path))
    assert_one_clear_error(proc, 4, "sha256 mismatch", wrong, sha256_file(sdist))
    assert not (tmp_path / "src").exists(), "a mismatched sdist must not be unpacked"


def test_sha256_mismatch_of_a_file_in_sources_dir(real_sdist, run_fa_images, tmp_path: Path, prepare_only) -> None:
    sources = real_sdist("2.8.3").parent
    proc = run_fa_images(
        prepare_only(
            "--sources-dir",
            sources,
            "--sha256",
            "ab" * 32,
            "--index-url",
            "http://127.0.0.1:9/simple",
            flash_attn="2.8.3",
            out=tmp_path / "dist",
            work=tmp_path,
        )
    )
    assert_one_clear_error(proc, 4, "sha256 mismatch", "flash_attn-2.8.3.tar.gz")


@pytest.mark.parametrize(
    ("version", "needle"),
    [("2.4.2", "outside the versions"), ("2.9.0", "outside the versions"), ("two.eight", "not a valid")],
)
def test_unsupported_version_is_a_usage_error(
    run_fa_images, tmp_path: Path, version: str, needle: str, prepare_only
) -> None:
    proc = run_fa_images(
        prepare_only(
            "--index-url", "http://127.0.0.1:9/simple", flash_attn=version, out=tmp_path / "dist", work=tmp_path
        )
    )
    line = assert_one_clear_error(proc, 2, version, needle)
    if needle.startswith("outside"):
        assert "--allow-untested" in proc.stderr, line
    assert not any(tmp_path.iterdir()), "nothing may be fetched for a refused version"


def test_unsupported_version_of_a_local_sdist(run_fa_images, tmp_path: Path, prepare_only) -> None:
    sdist = make_tiny_sdist(tmp_path / "in", version="2.4.2")
    proc = run_fa_images(prepare_only(sdist=sdist, out=tmp_path / "dist", work=tmp_path / "w"))
    assert_one_clear_error(proc, 2, "flash-attn 2.4.2 is outside")


def test_json_without_prepare_only_is_refused_up_front(run_fa_images, tmp_path: Path) -> None:
    work = tmp_path / "work"
    proc = run_fa_images(
        [
            "wheel",
            "--flash-attn",
            "2.8.3",
            "--json",
            "--out",
            tmp_path / "dist",
            "--work-dir",
            work,
            "--index-url",
            "http://127.0.0.1:9/simple",
        ]
    )
    assert_one_clear_error(proc, 2, "--json", "--prepare-only")
    assert not work.exists()


@pytest.mark.parametrize("archs", ["86", "75", "sm_90a", ",", "8.9"])
def test_bad_archs_are_refused_by_the_parser(run_fa_images, tmp_path: Path, archs: str, prepare_only) -> None:
    proc = run_fa_images(prepare_only("--archs", archs, flash_attn="2.8.3", out=tmp_path))
    assert proc.returncode == 2
    assert "--archs" in proc.stderr and "Traceback" not in proc.stderr


def test_expect_cxx11_abi_guards_the_torch_variant(
    run_fa_images, tmp_path: Path, system_torch: dict, prepare_only
) -> None:
    sdist = make_tiny_sdist(tmp_path / "in", version="2.8.3")
    other = str(not system_torch["abi"]).lower()
    proc = run_fa_images(prepare_only("--expect-cxx11-abi", other, sdist=sdist, out=tmp_path / "dist", work=tmp_path))
    assert_one_clear_error(proc, 3, f"cxx11_abi={system_torch['abi']}", "wrong torch variant")
    same = str(system_torch["abi"]).lower()
    proc = run_fa_images(prepare_only("--expect-cxx11-abi", same, sdist=sdist, out=tmp_path / "dist", work=tmp_path))
    assert proc.returncode == 0, proc.stderr


def test_missing_local_sdist(run_fa_images, tmp_path: Path, prepare_only) -> None:
    proc = run_fa_images(prepare_only(sdist=tmp_path / "nope.tar.gz", out=tmp_path / "dist", work=tmp_path))
    assert_one_clear_error(proc, 2, "does not exist")


def test_a_file_that_is_not_an_sdist(run_fa_images, tmp_path: Path, prepare_only) -> None:
    bogus = tmp_path / "flash_attn-2.8.3.tar.gz"
    bogus.write_bytes(b"<html>rate limited</html>")
    proc = run_fa_images(prepare_only(sdist=bogus, out=tmp_path / "dist", work=tmp_path / "w"))
    assert_one_clear_error(proc, 4, "not a readable .tar.gz")


def test_an_sdist_that_escapes_its_directory_is_not_unpacked(run_fa_images, tmp_path: Path, prepare_only) -> None:
    evil = tmp_path / "flash_attn-2.8.3.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        for name, data in [
            ("flash_attn-2.8.3/setup.py", b"print('hi')\n"),
            ("flash_attn-2.8.3/../../../../escaped.txt", b"gotcha\n"),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    work = tmp_path / "a" / "b"
    proc = run_fa_images(prepare_only(sdist=evil, out=tmp_path / "dist", work=work))
    assert proc.returncode == 4, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.rglob("escaped.txt"))


# --- the index (a local simple index: PEP 691 JSON, or PEP 503 HTML whatever is asked) ------


@dataclass
class FakeIndex:
    """A simple index for flash-attn, served from this process. ``html``: answer PEP 503 HTML
    whatever the Accept header asks, as pypiserver and many mirrors do."""

    port: int
    html: bool = False
    versions: list[str] = field(default_factory=list)
    files: dict[str, tuple[bytes, str]] = field(default_factory=dict)  # name -> (bytes, published sha256)
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    def url(self, credentials: str = "") -> str:
        return f"http://{credentials + '@' if credentials else ''}127.0.0.1:{self.port}/simple"

    def listing(self) -> bytes:
        return json.dumps(
            {
                "meta": {"api-version": "1.1"},
                "name": "flash-attn",
                "versions": self.versions,
                "files": [
                    {"filename": name, "url": f"../../files/{name}", "hashes": {"sha256": sha}}
                    for name, (_data, sha) in self.files.items()
                ],
            }
        ).encode()

    def html_listing(self) -> bytes:
        links = [f'<a href="../../files/{n}#sha256={sha}">{n}</a><br/>' for n, (_d, sha) in self.files.items()]
        links += [f'<a href="../../files/flash_attn-{v}.tar.gz">flash_attn-{v}.tar.gz</a>' for v in self.versions]
        return ("<!DOCTYPE html><html><body><h1>Links for flash-attn</h1>" + "".join(links) + "</body></html>").encode()

    def add_sdist(self, path: Path, published_sha256: str | None = None) -> None:
        data = path.read_bytes()
        self.files[path.name] = (data, published_sha256 or hashlib.sha256(data).hexdigest())


@pytest.fixture
def fake_index() -> Iterator[FakeIndex]:
    index: FakeIndex | None = None

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            assert index is not None
            index.requests.append((self.path, dict(self.headers)))
            if self.path == "/simple/flash-attn/":
                if index.html:
                    body, ctype = index.html_listing(), "text/html"
                else:
                    body, ctype = index.listing(), "application/vnd.pypi.simple.v1+json"
            elif self.path.startswith("/files/") and self.path[len("/files/") :] in index.files:
                body, ctype = index.files[self.path[len("/files/") :]][0], "application/octet-stream"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    index = FakeIndex(port=server.server_address[1], versions=["2.7.4.post1", "2.8.2", "2.8.3"])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield index
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("html", [False, True], ids=["json", "html"])
def test_untested_version_missing_from_the_index(
    fake_index: FakeIndex, run_fa_images, tmp_path: Path, prepare_only, html: bool
) -> None:
    fake_index.html = html
    proc = run_fa_images(
        prepare_only(
            "--allow-untested",
            "--index-url",
            fake_index.url(),
            flash_attn="9.9.9",
            out=tmp_path / "dist",
            work=tmp_path,
        )
    )
    assert_one_clear_error(proc, 4, "flash-attn 9.9.9", fake_index.url())
    assert "2.8.3" in proc.stderr  # the hint names what the index does have
    ((path, headers),) = fake_index.requests
    assert path == "/simple/flash-attn/"
    assert "application/vnd.pypi.simple.v1+json" in headers.get("Accept", "")


def test_index_credentials_are_sent_but_never_printed(
    fake_index: FakeIndex, run_fa_images, tmp_path: Path, prepare_only
) -> None:
    proc = run_fa_images(
        prepare_only(
            "--allow-untested",
            "--index-url",
            fake_index.url("alice:s3cr%2Ft"),
            flash_attn="9.9.9",
            out=tmp_path / "dist",
            work=tmp_path,
        )
    )
    assert proc.returncode == 4, proc.stderr
    ((_path, headers),) = fake_index.requests
    assert headers.get("Authorization") == "Basic " + base64.b64encode(b"alice:s3cr/t").decode()
    assert "s3cr" not in proc.stderr + proc.stdout and "alice" not in proc.stderr + proc.stdout
    assert "***@127.0.0.1" in proc.stderr


def test_redacted_index_url_keeps_its_port(fake_index: FakeIndex, run_fa_images, tmp_path: Path, prepare_only) -> None:
    proc = run_fa_images(
        prepare_only(
            "--allow-untested",
            "--index-url",
            fake_index.url("alice:s3cret"),
            flash_attn="9.9.9",
            out=tmp_path / "dist",
            work=tmp_path,
        )
    )
    assert proc.returncode == 4, proc.stderr
    assert f"***@127.0.0.1:{fake_index.port}/simple" in proc.stderr


@pytest.mark.parametrize("html", [False, True], ids=["json", "html"])
def test_download_from_the_index_is_checked_and_kept(
    fake_index: FakeIndex, run_fa_images, tmp_path: Path, prepare_only, html: bool
) -> None:
    fake_index.html = html
    sdist = make_tiny_sdist(tmp_path / "published", version="2.8.3")
    fake_index.add_sdist(sdist)
    work = tmp_path / "work"
    proc = run_fa_images(
        prepare_only(
            "--index-url",
            fake_index.url(),
            flash_attn="2.8.3",
            out=tmp_path / "dist",
            work=work,
            keep_work=True,
            json=True,
        )
    )
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    (scratch,) = work.iterdir()
    downloaded = scratch / "sdists" / "flash_attn-2.8.3.tar.gz"
    assert s["sdist"] == str(downloaded)
    assert downloaded.read_bytes() == sdist.read_bytes()
    assert s["sha256"] == sha256_file(sdist)
    assert s["flash_attn"] == "2.8.3"
    assert [p for p, _h in fake_index.requests] == ["/simple/flash-attn/", "/files/flash_attn-2.8.3.tar.gz"]


def test_download_with_a_wrong_published_sha256_leaves_nothing(
    fake_index: FakeIndex, run_fa_images, tmp_path: Path, prepare_only
) -> None:
    sdist = make_tiny_sdist(tmp_path / "published", version="2.8.3")
    fake_index.add_sdist(sdist, published_sha256="cd" * 32)
    work = tmp_path / "work"
    proc = run_fa_images(
        prepare_only("--index-url", fake_index.url(), flash_attn="2.8.3", out=tmp_path / "dist", work=work)
    )
    assert_one_clear_error(proc, 4, "sha256 mismatch", "cd" * 32, sha256_file(sdist))
    assert list(work.iterdir()) == [], "a failed download must leave nothing behind"


def test_a_pinned_sha256_that_the_index_contradicts(
    fake_index: FakeIndex, run_fa_images, tmp_path: Path, prepare_only
) -> None:
    sdist = make_tiny_sdist(tmp_path / "published", version="2.8.3")
    fake_index.add_sdist(sdist)
    proc = run_fa_images(
        prepare_only(
            "--sha256",
            "ef" * 32,
            "--index-url",
            fake_index.url(),
            flash_attn="2.8.3",
            out=tmp_path / "dist",
            work=tmp_path / "work",
        )
    )
    assert_one_clear_error(proc, 4, "ef" * 32, "pinned")
    assert [p for p, _h in fake_index.requests] == ["/simple/flash-attn/"], "nothing may be downloaded"


def test_by_version_uses_sources_dir_before_the_index(
    fake_index: FakeIndex, real_sdist, run_fa_images, tmp_path: Path, prepare_only
) -> None:
    cached = real_sdist("2.8.3")
    proc = run_fa_images(
        prepare_only(
            "--sources-dir",
            cached.parent,
            "--index-url",
            fake_index.url(),
            flash_attn="2.8.3",
            out=tmp_path / "dist",
            work=tmp_path,
            json=True,
        )
    )
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    assert s["sdist"] == str(cached)
    assert s["sha256"] == sha256_file(cached)
    assert (s["flash_attn"], s["honours_cuda_archs_env"]) == ("2.8.3", True)
    assert fake_index.requests == [], "a file in --sources-dir must make the index unnecessary"
