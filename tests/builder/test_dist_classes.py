"""A dist/ of two GPU classes: an index per class, and what pip, uv and `fa-images pick` give a G5 and a P5.

The wheels are small but real: one shared library compiled by nvcc for sm_80 alone, one for sm_90
alone, named and labelled as fa-images names a matrix's per-class wheels (``.sm80``, ``.sm90``),
merged through `fa-images dist merge`, installed by pip and uv into throwaway venvs.
"""

from __future__ import annotations

import json
import re
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


def test_each_class_has_an_index_of_its_own_beside_the_one_index(two_classes: Path) -> None:
    every = sorted(dist.read_manifest(two_classes).wheels)
    assert _linked(two_classes / "simple" / "flash-attn" / "index.html") == every
    for cls in CLASSES:
        [wheel] = _linked(two_classes / cls / "simple" / "flash-attn" / "index.html")
        assert f".{cls}-" in wheel
        assert (two_classes / cls / "simple" / "index.html").read_text().count('href="flash-attn/"') == 1


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_a_plain_install_from_a_class_index_gets_that_class_s_wheel(
    two_classes: Path, tmp_path: Path, installer: str
) -> None:
    """`pip install --index-url …/sm80/simple flash-attn`, no version: the sm80 wheel, where the
    one index would give every node the sm90 wheel (local labels rank as text)."""
    got = {}
    for index in ("simple", "sm80/simple", "sm90/simple"):
        venv = tmp_path / index.replace("/", "-")
        python = fresh_venv(venv)
        source = ["--index-url", (two_classes / index).as_uri(), "flash-attn"]
        install = pip_install(python, *source) if installer == "pip" else uv_install(python, tmp_path / "uv", *source)
        assert install.returncode == 0, install.stdout + install.stderr
        got[index] = installed_version(python)
        site = next((venv / "lib").glob("python3*/site-packages"))
        assert (site / SO_NAME).is_file()
    assert got == {"simple": f"{BASE}.sm90", "sm80/simple": f"{BASE}.sm80", "sm90/simple": f"{BASE}.sm90"}


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
    assert len(uploaded) == len(set(uploaded)) == 4  # two wheels and their .metadata, once each
    for cls in CLASSES:
        page = (web / "site" / cls / "simple" / "flash-attn" / "index.html").read_text()
        assert page.count(f'href="{url}release/') == 1 and f".{cls}-" in page
    python = fresh_venv(tmp_path / "node")
    install = pip_install(python, "--index-url", f"{url}site/sm80/simple/", "flash-attn")
    assert install.returncode == 0, install.stderr
    assert installed_version(python) == f"{BASE}.sm80"
    assert not any(".sm90-" in path and path.endswith(".whl") for path in requested)
