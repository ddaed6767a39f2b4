"""A dist/ of two GPU classes: an index per class, and what pip, uv and `fa-images pick` give a G5 and a P5.

The wheels are small but real: one shared library compiled by nvcc for sm_80 alone, one for sm_90
alone, named and labelled as fa-images names a matrix's per-class wheels (``.sm80``, ``.sm90``),
merged through `fa-images dist merge`, installed by pip and uv into throwaway venvs.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
from pathlib import Path

import pytest
from test_builder_verify import SO_NAME
from test_dist import a_run, fresh_venv, installed_version, pip_install, publish, uv_install

from fa_images.builder import dist, safe_io

BASE = "2.8.3+cu128torch2.9cxx11abitrue"
CLASSES = {"sm80": "80", "sm90": "90"}
IMAGE = "registry.example/fa/flash-attn:fa2.8.3-py3.11-torch2.9.1-cu128"


@pytest.fixture(scope="module")
def two_classes(cuda_home: Path, tmp_path_factory, run_fa_images) -> Path:
    """dist/ with the sm80 and the sm90 wheel of one flash-attn, Python, torch and CUDA."""
    from test_builder_verify import nvcc_shared_library

    root = tmp_path_factory.mktemp("classes")
    runs = []
    for cls, arch in CLASSES.items():
        so = nvcc_shared_library(
            cuda_home / "bin" / "nvcc",
            root / cls / "kernel.so",
            gencode=["-gencode", f"arch=compute_{arch},code=sm_{arch}"],
        )
        out = a_run(root / f"job-{cls}", f"{BASE}.{cls}", so, archs=(arch,), entry=f"e-{cls}", image=f"{IMAGE}-{cls}")
        runs.append(out.parent)
    proc = run_fa_images(["dist", "merge", *runs, "--dist", root / "dist"])
    assert proc.returncode == 0, proc.stderr
    return root / "dist"


def _linked(page: Path) -> list[str]:
    return sorted(n.replace("%2B", "+") for n in re.findall(r'href="(?:\.\./)+([^"#]+)#sha256=', page.read_text()))


def test_each_class_has_an_index_of_its_own_and_the_one_index_its_variant_twins(two_classes: Path) -> None:
    every = sorted(dist.read_manifest(two_classes).wheels)
    twins = [f"variants/flash_attn-{BASE}-cp311-cp311-linux_x86_64-{cls}.whl" for cls in CLASSES]
    one = _linked(two_classes / "simple" / "flash-attn" / "index.html")
    assert one == [*twins, f"variants/flash_attn-{BASE}-variants.json"]
    for cls in CLASSES:
        [wheel] = _linked(two_classes / cls / "simple" / "flash-attn" / "index.html")
        assert wheel in every and f".{cls}-" in wheel
        assert (two_classes / cls / "simple" / "index.html").read_text().count('href="flash-attn/"') == 1


def test_a_twin_is_its_class_wheel_under_the_shared_version(two_classes: Path) -> None:
    import zipfile

    for cls, arch in CLASSES.items():
        twin = two_classes / "variants" / f"flash_attn-{BASE}-cp311-cp311-linux_x86_64-{cls}.whl"
        source = next(two_classes.glob(f"flash_attn-{BASE}.{cls}-*.whl"))
        with zipfile.ZipFile(twin) as z, zipfile.ZipFile(source) as s:
            assert z.read(SO_NAME) == s.read(SO_NAME)  # the class's kernels, byte for byte
            info = f"flash_attn-{BASE}.dist-info"
            assert f"Version: {BASE}\n" in z.read(f"{info}/METADATA").decode()
            variant = json.loads(z.read(f"{info}/variant.json"))
            properties = {"sm_arch": [f"{arch}_real"], "cuda_version_lower_bound": ["12.0"]}
            assert variant["variants"] == {cls: {"nvidia": properties}}
            for line in z.read(f"{info}/RECORD").decode().splitlines():  # every member as RECORD says it is
                name, digest, size = line.split(",")
                if digest:
                    data = z.read(name)
                    assert (
                        digest
                        == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                    )
                    assert int(size) == len(data)
            assert f"{info}/variant.json,sha256=" in z.read(f"{info}/RECORD").decode()
    index = json.loads((two_classes / "variants" / f"flash_attn-{BASE}-variants.json").read_text())
    assert sorted(index["variants"]) == sorted(CLASSES)


@pytest.fixture
def http_dist(two_classes: Path):
    """dist/ over http, as a node reaches a published one."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(two_classes)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def _uv_variants(python: Path, cache: Path, index: str, sm_arch: str | None) -> subprocess.CompletedProcess:
    """uv's wheel variants, its NVIDIA provider answered as on a node of ``sm_arch`` with a CUDA 12.8
    driver (uv's own override: there is no GPU here)."""
    import os
    import shutil

    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "NV_VARIANT_"))}
    env["UV_CACHE_DIR"] = str(cache)
    if sm_arch:
        env |= {"NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION": "12.8", "NV_VARIANT_PROVIDER_FORCE_SM_ARCH": sm_arch}
    uv = shutil.which("uv")
    assert uv
    command = [uv, "pip", "install", "--no-config", "--python", str(python), "--no-deps", "--preview-features",
               "wheel-variants", "--index-url", index, "flash-attn"]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, env=env)


@pytest.mark.parametrize("sm_arch, cls", [("8.6", "sm80"), ("8.9", "sm80"), ("9.0", "sm90")])
def test_uv_with_wheel_variants_takes_the_node_s_class_from_the_one_index(
    two_classes: Path, http_dist: str, tmp_path: Path, sm_arch: str, cls: str
) -> None:
    import zipfile

    python = fresh_venv(tmp_path / "node")
    proc = _uv_variants(python, tmp_path / "uv", http_dist + "simple/", sm_arch)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert installed_version(python) == BASE
    site = next((tmp_path / "node" / "lib").glob("python3*/site-packages"))
    source = next(two_classes.glob(f"flash_attn-{BASE}.{cls}-*.whl"))
    with zipfile.ZipFile(source) as wheel:
        assert (site / SO_NAME).read_bytes() == wheel.read(SO_NAME)
    assert cls in json.loads((site / f"flash_attn-{BASE}.dist-info" / "variant.json").read_text())["variants"]


@pytest.mark.parametrize("sm_arch", [None, "7.5", "12.0"])
def test_a_node_no_class_runs_on_gets_no_wheel_rather_than_another_class_s(
    http_dist: str, tmp_path: Path, sm_arch: str | None
) -> None:
    python = fresh_venv(tmp_path / "node")
    proc = _uv_variants(python, tmp_path / "uv", http_dist + "simple/", sm_arch)
    assert proc.returncode != 0 and "variant" in proc.stderr, proc.stderr
    plain = pip_install(python, "--index-url", http_dist + "simple/", "flash-attn")
    assert plain.returncode != 0  # pip knows no variants: it skips them, and no class's wheel is offered there


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_a_plain_install_from_a_class_index_gets_that_class_s_wheel(
    two_classes: Path, tmp_path: Path, installer: str
) -> None:
    """`pip install --index-url …/sm80/simple flash-attn`, no version: the sm80 wheel, where one
    index of both would give every node the sm90 wheel (local labels rank as text)."""
    got = {}
    for index in ("sm80/simple", "sm90/simple"):
        venv = tmp_path / index.replace("/", "-")
        python = fresh_venv(venv)
        source = ["--index-url", (two_classes / index).as_uri(), "flash-attn"]
        install = pip_install(python, *source) if installer == "pip" else uv_install(python, tmp_path / "uv", *source)
        assert install.returncode == 0, install.stdout + install.stderr
        got[index] = installed_version(python)
        site = next((venv / "lib").glob("python3*/site-packages"))
        assert (site / SO_NAME).is_file()
    assert got == {"sm80/simple": f"{BASE}.sm80", "sm90/simple": f"{BASE}.sm90"}


@pytest.mark.parametrize("node, cls", [("g5", "sm80"), ("p5", "sm90"), ("g6e", "sm80")])
def test_pick_names_the_tag_and_the_lines_of_a_node_s_class(
    two_classes: Path, run_fa_images, node: str, cls: str
) -> None:
    proc = run_fa_images(["pick", node, "--dist", two_classes, "--json", "--index-url", "https://wheels.example/fa"])
    assert proc.returncode == 0, proc.stderr
    [found] = json.loads(proc.stdout)
    [offer] = found["offers"]
    assert offer["image"] == f"{IMAGE}-{cls}"
    assert offer["requirement"] == f"flash-attn=={BASE}.{cls}"
    assert offer["pip"] == f"pip install --index-url https://wheels.example/fa/{cls}/simple 'flash-attn=={BASE}.{cls}'"


def test_pick_refuses_a_gpu_neither_class_runs_on(two_classes: Path, run_fa_images) -> None:
    proc = run_fa_images(["pick", "g7e", "--dist", two_classes])
    assert proc.returncode == 8
    assert "nothing in" in proc.stderr and "g5 (A10G)" in proc.stderr and "p5 (H100)" in proc.stderr


def test_the_pick_lines_install_the_wheel_they_name(two_classes: Path, tmp_path: Path, run_fa_images) -> None:
    """The pip line `pick` prints for a G5, run as it is: the node's class wheel."""
    proc = run_fa_images(["pick", "g5", "--dist", two_classes, "--json"])
    [found] = json.loads(proc.stdout)
    [offer] = found["offers"]
    python = fresh_venv(tmp_path / "node")
    index = offer["index_url"]
    install = pip_install(python, "--index-url", index, offer["requirement"])
    assert install.returncode == 0, install.stderr
    assert installed_version(python) == f"{BASE}.sm80"


def test_a_class_that_goes_loses_its_index_and_nothing_else(two_classes: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "dist"
    shutil.copytree(two_classes, copy)
    (copy / "sm90" / "notes.txt").write_text("a file fa-images did not write")
    manifest = dist.read_manifest(copy)
    sm90 = next(n for n in manifest.wheels if ".sm90-" in n)
    (copy / sm90).unlink()
    del manifest.wheels[sm90]
    dist.write_simple_index(copy, manifest)
    assert (copy / "sm80" / "simple" / "flash-attn" / "index.html").is_file()  # its wheel still names it
    assert (copy / "sm90" / "notes.txt").is_file()
    assert not (copy / "sm90" / "simple").exists()


def test_a_class_index_planted_as_a_link_is_refused(two_classes: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "dist"
    shutil.copytree(two_classes, copy)
    shutil.rmtree(copy / "sm80")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (copy / "sm80").symlink_to(elsewhere)
    with pytest.raises(safe_io.UnsafeOutput):
        dist.write_simple_index(copy, dist.read_manifest(copy))
    assert list(elsewhere.iterdir()) == []


def test_a_published_site_serves_each_class_its_index(
    two_classes: Path, site_server, tmp_path: Path, run_fa_images
) -> None:
    """`dist site`: the class indexes too, each link where the release serves the wheel; a node
    installs its class's wheel from them over http, each wheel uploaded once."""
    web, url, requested = site_server
    proc = publish(run_fa_images, two_classes, web, url, first=True)
    assert proc.returncode == 0, proc.stderr
    uploaded = [Path(p).name for p in proc.stdout.split()]
    assert len(uploaded) == len(set(uploaded)) == 6  # two wheels, their .metadata and their twins, once each
    for cls in CLASSES:
        page = (web / "site" / cls / "simple" / "flash-attn" / "index.html").read_text()
        assert page.count(f'href="{url}release/') == 1 and f".{cls}-" in page
    python = fresh_venv(tmp_path / "node")
    install = pip_install(python, "--index-url", f"{url}site/sm80/simple/", "flash-attn")
    assert install.returncode == 0, install.stderr
    assert installed_version(python) == f"{BASE}.sm80"
    assert not any(".sm90-" in path and path.endswith(".whl") for path in requested)
    front = (web / "site" / "index.html").read_text()  # the front page: what each node takes
    assert f"pip install --index-url ./sm80/simple &#x27;flash-attn=={BASE}.sm80&#x27;" in front
    again = publish(run_fa_images, two_classes, web, url)  # --published: every class page read, nothing new
    assert again.returncode == 0, again.stderr
    assert again.stdout.split() == [] and "site: 2 wheels, 0 new wheels" in again.stderr
    front = (web / "site" / "index.html").read_text()
    g5, p5, g4dn = (front[front.index(f'<td rowspan="1">{n}</td>') :][:1500] for n in ("g5", "p5", "g4dn"))
    assert f"--index-url {url}site/sm80/simple" in g5 and "sm90" not in g5.split("</tr>")[0]
    assert f"--index-url {url}site/sm90/simple" in p5 and "docker pull registry.example/fa/flash-attn" in p5
    assert "nothing here runs on it" in g4dn.split("</tr>")[0]
    picked = run_fa_images(["pick", "p5", "--published", f"{url}site/", "--json"])  # a node that has only the URL
    assert picked.returncode == 0, picked.stderr
    [offer] = json.loads(picked.stdout)[0]["offers"]
    assert offer["pip"] == f"pip install --index-url {url}site/sm90/simple 'flash-attn=={BASE}.sm90'"
    requested.clear()
    varied = fresh_venv(tmp_path / "varied")
    proc = _uv_variants(varied, tmp_path / "uv", f"{url}site/simple/", "9.0")  # the one index, the twins in the release
    assert proc.returncode == 0, proc.stderr
    assert installed_version(varied) == BASE
    assert any(path.endswith("-sm90.whl") and path.startswith("/release/") for path in requested), requested
