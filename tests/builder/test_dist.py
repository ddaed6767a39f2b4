"""dist/: one manifest schema for every writer, `fa-images dist merge`, and the PEP 503 index.

The wheels are small but real: a shared library compiled by nvcc with sm_80 and sm_90 code,
zipped by the verifier tests' own helper, named and labelled like the wheels fa-images builds.
pip and uv install them from dist/ into throwaway venvs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from urllib.parse import quote as quote_plus

import pytest
from test_builder_verify import CP, PY, SO_NAME, make_wheel, nvcc_shared_library

from fa_images.builder import dist
from fa_images.builder.errors import UsageError

LABEL_A = "2.8.3+cu128torch2.9cxx11abitrue"
LABEL_B = "2.8.3+cu130torch2.11cxx11abitrue"
SHA = "ab" * 32


@pytest.fixture(scope="module")
def kernel_so(cuda_home: Path, tmp_path_factory) -> Path:
    return nvcc_shared_library(cuda_home / "bin" / "nvcc", tmp_path_factory.mktemp("kernel") / "kernel.so")


def wheel_name(version: str) -> str:
    return f"flash_attn-{version}-{CP}-{CP}-linux_x86_64.whl"


def sound_wheel(dest: Path, version: str, so: Path, extra: bytes = b"") -> Path:
    """A verifiable, installable wheel: the GPU library plus a RECORD (pip and uv need one)."""
    dist_info = f"flash_attn-{version}.dist-info"
    record = (
        f"{SO_NAME},,\nflash_attn/__init__.py,,\n{dist_info}/METADATA,,\n{dist_info}/WHEEL,,\n{dist_info}/RECORD,,\n"
    )
    files = {
        SO_NAME: so.read_bytes(),
        "flash_attn/__init__.py": b"# tiny\n" + extra,
        f"{dist_info}/RECORD": record.encode(),
    }
    return make_wheel(dest, wheel_name(version), files)


def record_for(wheel: Path, **overrides) -> dist.WheelRecord:
    fields = {
        "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        "size": wheel.stat().st_size,
        "flash_attn": "2.8.3",
        "python": PY,
        "torch": "2.9.1",
        "cuda": "12.8",
        "cxx11_abi": True,
        "archs": ("80", "90"),
        **overrides,
    }
    return dist.WheelRecord(**fields)


def a_run(root: Path, version: str, so: Path, **overrides) -> Path:
    """What one CI job uploads: a folder with its wheel and manifest, as `wheel`/`build` write it."""
    staging = root / "staging"
    wheel = sound_wheel(staging, version, so, extra=overrides.pop("extra", b""))
    out = root / "dist"
    dist.add_wheels(out, [dist.Incoming(wheel, record_for(wheel, **overrides), "test")], move=True)
    shutil.rmtree(staging)
    return out


def manifest_of(directory: Path) -> dict:
    return json.loads((directory / dist.MANIFEST).read_text())


def fresh_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path / "bin" / "python"


def installed_version(python: Path) -> str:
    return subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('flash_attn'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def pip_install(python: Path, *args: str) -> subprocess.CompletedProcess:
    # --isolated: this machine's pip config adds indexes and find-links of its own.
    cmd = [sys.executable, "-m", "pip", "--isolated", "--python", str(python), "install", "--no-deps", *args]
    return subprocess.run(cmd, capture_output=True, text=True)


def uv_install(python: Path, cache: Path, *args: str) -> subprocess.CompletedProcess:
    uv = shutil.which("uv")
    assert uv, "uv is in the test extra"
    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")} | {"UV_CACHE_DIR": str(cache)}
    cmd = [uv, "pip", "install", "--no-config", "--python", str(python), "--no-deps", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


# --- merge, index and installers, with real wheels ----------------------------------------


@pytest.fixture(scope="module")
def merged(kernel_so: Path, tmp_path_factory, run_fa_images) -> Path:
    """Wheels of two separate runs merged into one dist/."""
    root = tmp_path_factory.mktemp("merge")
    run1 = a_run(root / "job1", LABEL_A, kernel_so)
    run2 = a_run(root / "job2", LABEL_B, kernel_so, torch="2.11.0", cuda="13.0")
    proc = run_fa_images(["dist", "merge", run1.parent, run2.parent, "--dist", root / "dist"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("merged ") == 2 and "2 wheels" in proc.stdout
    return root / "dist"


def test_merge_records_both_runs_under_one_schema(merged: Path) -> None:
    data = manifest_of(merged)
    assert data["schema_version"] == dist.SCHEMA_VERSION
    assert sorted(data["wheels"]) == sorted([wheel_name(LABEL_A), wheel_name(LABEL_B)])
    for name, record in data["wheels"].items():
        assert record["sha256"] == hashlib.sha256((merged / name).read_bytes()).hexdigest()
    assert data["wheels"][wheel_name(LABEL_B)]["torch"] == "2.11.0"
    assert not [p.name for p in merged.rglob(".*")], "no staging or temporary file is left behind"


def test_simple_index_lists_every_wheel_with_its_sha256(merged: Path) -> None:
    root = (merged / "simple" / "index.html").read_text()
    assert re.findall(r'href="([^"]+)"', root) == ["flash-attn/"]
    page = (merged / "simple" / "flash-attn" / "index.html").read_text()
    links = re.findall(r'href="\.\./\.\./([^"#]+)#sha256=([0-9a-f]{64})"', page)
    data = manifest_of(merged)["wheels"]
    assert sorted((n.replace("%2B", "+"), s) for n, s in links) == sorted((n, r["sha256"]) for n, r in data.items())


@pytest.mark.parametrize("installer", ["pip", "uv"])
@pytest.mark.parametrize("how", ["index-url", "find-links"])
def test_installers_take_the_wheel_from_dist(merged: Path, tmp_path: Path, installer: str, how: str) -> None:
    python = fresh_venv(tmp_path / "venv")
    source = ["--index-url", (merged / "simple").as_uri()] if how == "index-url" else ["--find-links", str(merged)]
    if installer == "pip" and how == "find-links":
        source = ["--no-index", *source]
    spec = f"flash-attn=={LABEL_A}"
    if installer == "pip":
        proc = pip_install(python, *source, spec)
    else:
        proc = uv_install(
            python, tmp_path / "uv-cache", *(["--no-index"] if how == "find-links" else []), *source, spec
        )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert installed_version(python) == LABEL_A
    site = next((tmp_path / "venv" / "lib").glob("python3*/site-packages"))
    assert (site / SO_NAME).is_file()


def test_merging_the_same_wheels_again_changes_nothing(merged: Path, tmp_path: Path, run_fa_images) -> None:
    copy = tmp_path / "again"
    shutil.copytree(merged, copy, ignore=shutil.ignore_patterns("simple"))
    before = manifest_of(merged)
    proc = run_fa_images(["dist", "merge", copy, "--dist", merged])
    assert proc.returncode == 0, proc.stderr
    assert manifest_of(merged) == before


def test_a_conflicting_sha256_is_refused_and_dist_is_untouched(
    merged: Path, kernel_so: Path, tmp_path: Path, run_fa_images
) -> None:
    other = a_run(tmp_path / "job3", LABEL_A, kernel_so, extra=b"# another build\n")
    before = {p.name: p.read_bytes() for p in merged.iterdir() if p.is_file()}
    proc = run_fa_images(["dist", "merge", other, "--dist", merged])
    assert proc.returncode == 6, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and "records" in lines[-1] and "refused" in lines[-1]
    assert "Traceback" not in proc.stderr
    assert {p.name: p.read_bytes() for p in merged.iterdir() if p.is_file()} == before


def test_an_unsound_wheel_stops_the_whole_merge(kernel_so: Path, tmp_path: Path, run_fa_images) -> None:
    good = a_run(tmp_path / "good", LABEL_A, kernel_so)
    bad = a_run(tmp_path / "bad", LABEL_B, kernel_so, archs=("80", "90", "100"))  # the .so has no sm_100
    proc = run_fa_images(["dist", "merge", good, bad, "--dist", tmp_path / "dist"])
    assert proc.returncode == 6, proc.stderr
    assert "missing sm_100" in proc.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "dist").exists() or not any((tmp_path / "dist").glob("*.whl"))


def test_a_wheel_that_differs_from_its_record_is_refused(kernel_so: Path, tmp_path: Path, run_fa_images) -> None:
    run = a_run(tmp_path / "job", LABEL_A, kernel_so)
    wheel = run / wheel_name(LABEL_A)
    with open(wheel, "ab") as f:
        f.write(b"\0")  # still a zip (trailing bytes), but no longer the recorded file
    proc = run_fa_images(["dist", "merge", run, "--dist", tmp_path / "dist"])
    assert proc.returncode == 6 and "records" in proc.stderr, proc.stderr


def test_a_wheel_without_a_record_is_bad_input(kernel_so: Path, tmp_path: Path, run_fa_images) -> None:
    loose = sound_wheel(tmp_path / "loose", LABEL_A, kernel_so)
    proc = run_fa_images(["dist", "merge", loose.parent, "--dist", tmp_path / "dist"])
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and "has no record" in proc.stderr


def test_deleting_a_wheel_makes_room_for_its_rebuild(merged: Path, kernel_so: Path, tmp_path: Path) -> None:
    target = tmp_path / "dist"
    shutil.copytree(merged, target)
    (target / wheel_name(LABEL_A)).unlink()
    rebuilt = a_run(tmp_path / "rebuild", LABEL_A, kernel_so, extra=b"# rebuilt\n")
    dist.merge([rebuilt], target, log=lambda _: None)
    assert (
        manifest_of(target)["wheels"][wheel_name(LABEL_A)]["sha256"]
        == manifest_of(rebuilt)["wheels"][wheel_name(LABEL_A)]["sha256"]
    )
    assert (
        manifest_of(rebuilt)["wheels"][wheel_name(LABEL_A)]["sha256"]
        in (target / "simple" / "flash-attn" / "index.html").read_text()
    )


# --- manifest shapes, without wheels (fast) ------------------------------------------------


def write_manifest(directory: Path, data: object) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / dist.MANIFEST).write_text(json.dumps(data) if not isinstance(data, str) else data)


def test_wheel_then_build_order_no_longer_breaks(tmp_path: Path) -> None:
    """The old `wheel` wrote one flat record; the old `build` then failed with KeyError: 'wheels'."""
    old_wheel = {"wheel": wheel_name(LABEL_A), "sha256": SHA, "size": 3, "flash_attn": "2.8.3", "python": PY}
    write_manifest(tmp_path, old_wheel)
    (tmp_path / wheel_name(LABEL_A)).write_bytes(b"old")
    new = tmp_path / "in" / wheel_name(LABEL_B)
    new.parent.mkdir()
    new.write_bytes(b"new")
    record = dist.WheelRecord(sha256="cd" * 32, size=3, flash_attn="2.8.3", python=PY, entry="e")
    notes: list[str] = []
    dist.add_wheels(tmp_path, [dist.Incoming(new, record, "test")], log=notes.append)
    data = manifest_of(tmp_path)
    assert data["schema_version"] == 1 and set(data["wheels"]) == {wheel_name(LABEL_A), wheel_name(LABEL_B)}
    assert any("migrating from fa-images wheel" in n for n in notes)


def test_the_old_build_shape_is_migrated(tmp_path: Path) -> None:
    old = {
        "sha256": SHA,
        "size": 1,
        "entry": "x",
        "image": "r/x:y",
        "flash_attn": "2.8.3",
        "python": "3.12",
        "torch": "2.9.1",
        "cuda": "12.8",
        "archs": ["80"],
        "cxx11_abi": True,
    }
    write_manifest(tmp_path, {"wheels": {wheel_name(LABEL_A): old}})
    manifest = dist.read_manifest(tmp_path)
    assert manifest.migrated_from and manifest.wheels[wheel_name(LABEL_A)].archs == ("80",)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("not json {", "is not a JSON manifest"),
        ([1, 2], "holds a JSON list"),
        ({"wheels": {"x.whl": {"sha256": "00"}}}, "is not a wheel file name"),
        ({"wheels": {wheel_name(LABEL_A): {"sha256": "00"}}}, "lacks size, flash_attn, python"),
        ({"schema_version": 99, "wheels": {}}, "upgrade fa-images"),
        ({"artifacts": []}, "is not an fa-images manifest"),
        ({"wheels": {f"../{wheel_name(LABEL_A)}": {}}}, "is not a wheel file name"),
    ],
)
def test_a_foreign_manifest_is_one_clear_error(tmp_path: Path, content: object, says: str, run_fa_images) -> None:
    write_manifest(tmp_path / "src", content)
    with pytest.raises(UsageError, match=re.escape(says)):
        dist.read_manifest(tmp_path / "src")
    proc = run_fa_images(["dist", "merge", tmp_path / "src", "--dist", tmp_path / "dist"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ") and says in proc.stderr


def test_merge_of_a_missing_folder_is_bad_input(tmp_path: Path, run_fa_images) -> None:
    proc = run_fa_images(["dist", "merge", tmp_path / "nope"])
    assert proc.returncode == 2 and "is not a directory" in proc.stderr


# --- PEP 658 metadata and the torch pin, against pip and uv over HTTP ---------------------
# Small real wheels, no compile: flash-attn-shaped wheels whose METADATA pins torch the way the
# shim writes it, and stand-in "torch" wheels in a local find-links folder, so no network is used.

PINNED = {"2.13": "2.8.3+cu130torch2.13cxx11abitrue", "2.14": "2.8.3+cu130torch2.14cxx11abitrue"}


def metadata_text(name: str, version: str, requires: list[str]) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    return "\n".join([*lines, *(f"Requires-Dist: {r}" for r in requires)]) + "\n\nA long README.\n"


def installable_wheel(dest: Path, filename: str, metadata: str, files: dict[str, bytes]) -> Path:
    """A wheel zip pip and uv install: the files, METADATA, WHEEL and RECORD."""
    name, version, *_ = filename.split("-")
    info = f"{name}-{version}.dist-info"
    tag = "-".join(filename.removesuffix(".whl").split("-")[-3:])
    files = {
        **files,
        f"{info}/METADATA": metadata.encode(),
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}\n".encode(),
    }
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in [*files, f"{info}/RECORD"]).encode()
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(dest / filename, "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname, data in files.items():
            zf.writestr(arcname, data)
    return dest / filename


def pinned_wheel(dest: Path, series: str) -> Path:
    version = PINNED[series]
    metadata = metadata_text("flash_attn", version, [f"torch=={series}.*", "einops"])
    return installable_wheel(dest, wheel_name(version), metadata, {"flash_attn/__init__.py": b"# pinned\n"})


@pytest.fixture(scope="module")
def pinned_dist(tmp_path_factory) -> tuple[Path, Path]:
    """(dist/ holding flash-attn wheels pinned to torch 2.13 and 2.14, a find-links folder of
    stand-in torch 2.13.0 and 2.14.0 and einops)."""
    root = tmp_path_factory.mktemp("pinned")
    wheels = [pinned_wheel(root / "staging", series) for series in PINNED]
    out = root / "dist"
    dist.add_wheels(out, [dist.Incoming(w, record_for(w), "test") for w in wheels], move=True)
    links = root / "links"
    for name, version in [("torch", "2.13.0"), ("torch", "2.14.0"), ("einops", "0.8.1")]:
        installable_wheel(
            links, f"{name}-{version}-py3-none-any.whl", metadata_text(name, version, []), {f"{name}.py": b""}
        )
    return out, links


@pytest.fixture
def served(pinned_dist: tuple[Path, Path]):
    """dist/ over HTTP on 127.0.0.1, with the paths every request asked for."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    requested: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            requested.append(self.path)

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(pinned_dist[0])))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple/", requested
    finally:
        server.shutdown()
        server.server_close()


def test_the_index_serves_each_wheels_metadata_with_its_hash(pinned_dist: tuple[Path, Path]) -> None:
    out, _links = pinned_dist
    page = (out / "simple" / "flash-attn" / "index.html").read_text()
    for version in PINNED.values():
        name = wheel_name(version)
        served_metadata = (out / f"{name}.metadata").read_bytes()
        with zipfile.ZipFile(out / name) as zf:
            assert served_metadata == zf.read(f"flash_attn-{version}.dist-info/METADATA")
        digest = hashlib.sha256(served_metadata).hexdigest()
        (anchor,) = [a for a in re.findall(r"<a [^>]*>", page) if quote_plus(name) in a]
        assert f'data-dist-info-metadata="sha256={digest}"' in anchor
        assert f'data-core-metadata="sha256={digest}"' in anchor


def test_a_wheel_without_metadata_gets_no_metadata_attributes(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "staging", wheel_name(PINNED["2.13"]), {"x": b""}, metadata_version=None)
    dist.add_wheels(tmp_path / "dist", [dist.Incoming(wheel, record_for(wheel), "test")], move=True)
    page = (tmp_path / "dist" / "simple" / "flash-attn" / "index.html").read_text()
    assert "data-core-metadata" not in page and not list((tmp_path / "dist").glob("*.metadata"))


def resolve(installer: str, tmp_path: Path, index: str, links: Path, *specs: str, dry_run: bool) -> tuple[Path, str]:
    python = fresh_venv(tmp_path / "venv")
    args = ["--index-url", index, "--find-links", str(links), *(["--dry-run"] if dry_run else []), *specs]
    if installer == "pip":
        cmd = [sys.executable, "-m", "pip", "--isolated", "--python", str(python), "install", "--no-cache-dir", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    else:
        env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")} | {
            "UV_CACHE_DIR": str(tmp_path / "uv-cache")
        }
        cmd = [shutil.which("uv") or "uv", "pip", "install", "--no-config", "--python", str(python), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return python, ("" if proc.returncode == 0 else f"FAILED {proc.returncode}\n") + proc.stdout + proc.stderr


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_the_right_torch_resolves_reading_only_metadata(installer: str, served, pinned_dist, tmp_path: Path) -> None:
    index, requested = served
    _python, out = resolve(installer, tmp_path, index, pinned_dist[1], "flash-attn", "torch==2.14.0", dry_run=True)
    assert not out.startswith("FAILED"), out
    assert PINNED["2.14"] in out and PINNED["2.13"] not in out
    wanted = quote_plus(wheel_name(PINNED["2.14"]))
    assert f"/{wanted}.metadata" in requested, requested
    assert not [p for p in requested if p.endswith(".whl")], f"a wheel was downloaded to read its metadata: {requested}"


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_a_wheel_pinned_to_another_torch_is_passed_over(installer: str, served, pinned_dist, tmp_path: Path) -> None:
    """torch 2.13: the newer 2.14 wheel is refused from its metadata alone, the 2.13 one installed."""
    index, requested = served
    python, out = resolve(installer, tmp_path, index, pinned_dist[1], "flash-attn", "torch==2.13.0", dry_run=False)
    assert not out.startswith("FAILED"), out
    assert installed_version(python) == PINNED["2.13"]
    wrong = quote_plus(wheel_name(PINNED["2.14"]))
    assert f"/{wrong}" not in requested, f"the wheel for torch 2.14 was downloaded: {requested}"


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_only_a_wheel_for_another_torch_is_refused(installer: str, served, pinned_dist, tmp_path: Path) -> None:
    index, _requested = served
    spec = f"flash-attn=={PINNED['2.14']}"
    _python, out = resolve(installer, tmp_path, index, pinned_dist[1], spec, "torch==2.13.0", dry_run=True)
    assert out.startswith("FAILED"), out
    assert re.search(r"torch *(==|>=) *2\.14", out), out  # the pin is named, whichever installer


# --- dist site: the index published apart from its wheels -------------------------------------


def one_pinned_dist(root: Path, series: str) -> Path:
    wheel = pinned_wheel(root / f"staging-{series}", series)
    dist.add_wheels(root / f"dist-{series}", [dist.Incoming(wheel, record_for(wheel), "test")], move=True)
    return root / f"dist-{series}"


def publish(run_fa_images, dist_dir: Path, web: Path, url: str, *, first: bool = False):
    """One scheduled run's publication: the site rewritten, the listed files uploaded to the release."""
    args = ["dist", "site", "--dist", dist_dir, "--out", web / "site", "--wheel-url", url + "release/"]
    proc = run_fa_images(args + ([] if first else ["--published", url + "site/"]))
    for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
        shutil.copy(line, web / "release")
    return proc


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_a_site_with_the_wheels_in_a_release_keeps_what_was_published(
    installer: str, site_server, pinned_dist, tmp_path: Path, run_fa_images
) -> None:
    web, url, requested = site_server
    first = publish(run_fa_images, one_pinned_dist(tmp_path, "2.13"), web, url, first=True)
    assert first.returncode == 0, first.stderr
    name13, name14 = wheel_name(PINNED["2.13"]), wheel_name(PINNED["2.14"])
    assert [Path(p).name for p in first.stdout.split()] == [name13, f"{name13}.metadata"]
    second = publish(run_fa_images, one_pinned_dist(tmp_path, "2.14"), web, url)
    assert second.returncode == 0, second.stderr
    assert [Path(p).name for p in second.stdout.split()] == [name14, f"{name14}.metadata"]  # only the new one
    assert "site: 2 wheels, 1 new wheel" in second.stderr
    assert sorted(manifest_of(web / "site")["wheels"]) == sorted([name13, name14])
    page = (web / "site" / "simple" / "flash-attn" / "index.html").read_text()
    assert page.count(f'href="{url}release/') == 2 and page.count("data-core-metadata=") == 2
    requested.clear()
    index = url + "site/simple/"
    python, out = resolve(installer, tmp_path, index, pinned_dist[1], "flash-attn", "torch==2.13.0", dry_run=False)
    assert not out.startswith("FAILED"), out
    assert installed_version(python) == PINNED["2.13"]
    assert f"/release/{quote_plus(name13)}" in requested and f"/release/{quote_plus(name14)}.metadata" in requested
    assert f"/release/{quote_plus(name14)}" not in requested, "the wheel for torch 2.14 was downloaded"


def test_a_site_refuses_another_wheel_under_a_published_name(site_server, tmp_path: Path, run_fa_images) -> None:
    web, url, _requested = site_server
    assert publish(run_fa_images, one_pinned_dist(tmp_path, "2.13"), web, url, first=True).returncode == 0
    before = (web / "site" / "manifest.json").read_bytes()
    rebuilt = tmp_path / "rebuilt"
    wheel = installable_wheel(
        rebuilt / "staging",
        wheel_name(PINNED["2.13"]),
        metadata_text("flash_attn", PINNED["2.13"], ["torch==2.13.*"]),
        {"flash_attn/__init__.py": b"# other bytes\n"},
    )
    dist.add_wheels(rebuilt / "dist", [dist.Incoming(wheel, record_for(wheel), "test")], move=True)
    proc = publish(run_fa_images, rebuilt / "dist", web, url)
    assert proc.returncode == 6 and proc.stdout == "", proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("error:")] != []
    assert "a published wheel is never replaced under its name" in proc.stderr
    assert (web / "site" / "manifest.json").read_bytes() == before


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--wheel-url", "https://u:s3cret@example.org/r/"], "holds a login"),
        (["--wheel-url", "file:///srv/wheels/"], "not an http(s)"),
        (["--wheel-url", 'https://example.org/"><script>'], "characters an index URL does not need"),
        (["--wheel-url", "https://example.org/r/", "--published", "ftp://example.org/"], "not an http(s)"),
    ],
)
def test_a_bad_site_url_is_one_line(args: list[str], said: str, tmp_path: Path, run_fa_images) -> None:
    dist_dir = one_pinned_dist(tmp_path, "2.13")
    proc = run_fa_images(["dist", "site", "--dist", dist_dir, "--out", tmp_path / "site", *args])
    assert proc.returncode == 2 and said in proc.stderr and "s3cret" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "site").exists()


def test_a_site_is_written_apart_from_its_dist(tmp_path: Path, run_fa_images) -> None:
    dist_dir = one_pinned_dist(tmp_path, "2.13")
    proc = run_fa_images(["dist", "site", "--dist", dist_dir, "--out", dist_dir, "--wheel-url", "https://e.org/r/"])
    assert proc.returncode == 2 and "the site is written apart from it" in proc.stderr
    (dist_dir / f"{wheel_name(PINNED['2.13'])}.metadata").write_bytes(b"Name: planted\n")
    proc = run_fa_images(["dist", "site", "--dist", dist_dir, "--out", tmp_path / "s", "--wheel-url", "https://e.org/"])
    assert proc.returncode == 2 and "is not the METADATA of" in proc.stderr


def test_a_site_takes_the_new_record_of_the_same_bytes(site_server, tmp_path: Path, run_fa_images) -> None:
    """A rebuild with the same wheel bytes (new inputs, a new image digest) updates the record."""
    web, url, _requested = site_server
    dist_dir = one_pinned_dist(tmp_path, "2.13")
    assert publish(run_fa_images, dist_dir, web, url, first=True).returncode == 0
    name = wheel_name(PINNED["2.13"])
    data = manifest_of(dist_dir)
    data["wheels"][name] |= {"inputs": "c" * 64, "pushed": "sha256:" + "d" * 64}
    (dist_dir / "manifest.json").write_text(json.dumps(data))
    again = publish(run_fa_images, dist_dir, web, url)
    assert again.returncode == 0 and again.stdout == "", again.stderr  # nothing to upload
    record = manifest_of(web / "site")["wheels"][name]
    assert (record["inputs"], record["pushed"]) == ("c" * 64, "sha256:" + "d" * 64)


def test_a_site_refuses_to_lose_a_wheel_its_page_does_not_serve(site_server, tmp_path: Path, run_fa_images) -> None:
    web, url, _requested = site_server
    assert publish(run_fa_images, one_pinned_dist(tmp_path, "2.13"), web, url, first=True).returncode == 0
    (web / "site" / "simple" / "flash-attn" / "index.html").write_text("<html></html>")  # a page cached apart
    proc = publish(run_fa_images, one_pinned_dist(tmp_path, "2.14"), web, url)
    assert proc.returncode == 4 and "refusing to write a site without it" in proc.stderr, proc.stderr
    assert sorted(manifest_of(web / "site")["wheels"]) == [wheel_name(PINNED["2.13"])]


def test_a_published_metadata_hash_that_is_not_hex_is_dropped(site_server, tmp_path: Path, run_fa_images) -> None:
    """The page's attribute is written into the next site's HTML: nothing but 64 hex digits."""
    web, url, _requested = site_server
    assert publish(run_fa_images, one_pinned_dist(tmp_path, "2.13"), web, url, first=True).returncode == 0
    page = web / "site" / "simple" / "flash-attn" / "index.html"
    hostile = 'data-core-metadata="sha256=x&quot; onmouseover=&quot;alert(1)"'
    page.write_text(re.sub(r'data-core-metadata="[^"]*"', hostile, page.read_text()))
    assert publish(run_fa_images, one_pinned_dist(tmp_path, "2.14"), web, url).returncode == 0
    written = page.read_text()
    assert "onmouseover" not in written and written.count("data-core-metadata=") == 1  # the new wheel's only


def test_a_server_that_speaks_no_http_is_one_error_line(tmp_path: Path, run_fa_images) -> None:
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def garbage() -> None:
        for _ in range(2):
            conn, _addr = listener.accept()
            conn.recv(65536)
            conn.sendall(b"garbage\r\n\r\n")
            conn.close()

    threading.Thread(target=garbage, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/"
    args = ["dist", "site", "--dist", one_pinned_dist(tmp_path, "2.13"), "--out", tmp_path / "site"]
    proc = run_fa_images([*args, "--wheel-url", "https://e.org/r/", "--published", url])
    listener.close()
    assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("error:")
