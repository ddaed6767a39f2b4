"""`fa-images pick`: the image and the pip and uv lines a node takes, by its GPU or instance family.

Over a matrix of two GPU classes (the fleet of docs/fleet.md); the installs from a dist/ of two
classes, with real wheels, pip and uv, are in tests/builder/test_dist_classes.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fa_images.config import compat as compat_mod
from fa_images.config import matrix as matrix_mod
from fa_images.config import pick
from fa_images.errors import UsageError

REPO = Path(__file__).resolve().parents[2]

FLEET = """\
matrix:
  python: ["3.12"]
  torch: ["2.9.1"]
  flash_attn: ["2.8.3"]
  target: [[g5, g6e], p5, g7e]
"""


@pytest.fixture
def pick_here(tmp_path: Path, run_fa_images):
    """`fa-images pick ARGS` in ``tmp_path``, over ``matrix`` (the fleet's by default)."""

    def run(*args: str, matrix: str = FLEET) -> subprocess.CompletedProcess[str]:
        (tmp_path / "matrix.yaml").write_text(matrix)
        return run_fa_images(["pick", *args], cwd=tmp_path)

    return run


@pytest.fixture(scope="module")
def table() -> compat_mod.Compat:
    return compat_mod.load()


@pytest.mark.parametrize(
    "name, gpu, capability",
    [("g5", "A10G", "8.6"), ("G6E", "L40S", "8.9"), ("RTX PRO 6000", "RTXPRO6000", "12.0"), ("sm_89", "L4", "8.9")],
)
def test_a_node_is_named_by_its_family_its_gpu_or_its_capability(table, name: str, gpu: str, capability: str) -> None:
    at = pick.node(table, name)
    assert at.capability == capability
    if name.startswith("sm_"):  # a capability names no GPU of its own
        assert at.gpu == "sm_89"
    else:
        assert at.gpu == gpu


@pytest.mark.parametrize("name, said", [("z9", "is not a GPU"), ("p6e-gb200", "aarch64")])
def test_a_node_fa_images_cannot_serve_is_bad_input(table, name: str, said: str) -> None:
    with pytest.raises(UsageError, match=said):
        pick.node(table, name)


@pytest.mark.parametrize(
    "node, entry, index",
    [
        ("g5", "fa2.8.3-py3.12-torch2.9.1-cu128-sm80", "sm80/simple"),
        ("g6e", "fa2.8.3-py3.12-torch2.9.1-cu128-sm80", "sm80/simple"),
        ("p5", "fa2.8.3-py3.12-torch2.9.1-cu128-sm90", "sm90/simple"),
        ("g7e", "fa2.8.3-py3.12-torch2.9.1-cu128-sm120", "sm120/simple"),
    ],
)
def test_each_node_takes_its_class_image_and_its_class_index(
    pick_here, tmp_path: Path, node: str, entry: str, index: str
) -> None:
    proc = pick_here(node, "--json", "--index-url", "https://acme.example/fa")
    assert proc.returncode == 0, proc.stderr
    [found] = json.loads(proc.stdout)
    [offer] = found["offers"]
    cls = entry.rsplit("-", 1)[1]
    requirement = f"flash-attn==2.8.3+cu128torch2.9cxx11abitrue.{cls}"
    assert offer["entry"] == entry
    assert offer["image"].endswith(f":{entry}")
    assert offer["requirement"] == requirement
    assert offer["index_url"] == f"https://acme.example/fa/{index}/"
    assert offer["pip"] == f"pip install --index-url https://acme.example/fa/{index} '{requirement}'"
    assert offer["uv"] == f"uv pip install --index-url https://acme.example/fa/{index} '{requirement}'"
    assert offer["pull"] == f"docker pull {offer['image']}"


def test_the_lines_are_printed_for_each_node_asked(pick_here, tmp_path: Path) -> None:
    proc = pick_here("g5", "p5")
    assert proc.returncode == 0, proc.stderr
    assert "g5: A10G (compute capability 8.6, AWS g5): 1 offer" in proc.stdout
    assert "H100 (compute capability 9.0, AWS p5): 1 offer" in proc.stdout
    default = (tmp_path / "dist").resolve().as_uri()
    pip = f"pip install --index-url {default}/sm80/simple 'flash-attn==2.8.3+cu128torch2.9cxx11abitrue.sm80'"
    variants = (
        f"--preview-features wheel-variants --index-url {default}/simple 'flash-attn==2.8.3+cu128torch2.9cxx11abitrue'"
    )
    assert f"    pip         {pip}\n" in proc.stdout and f"    uv-variants uv pip install {variants}\n" in proc.stdout


def test_a_gpu_nothing_runs_on_is_refused_with_what_it_runs_on(pick_here) -> None:
    proc = pick_here("g4dn")
    assert proc.returncode == 8
    assert proc.stdout == ""
    [line, hint] = proc.stderr.strip().splitlines()
    assert line == "error: nothing in matrix.yaml runs on g4dn: T4 (compute capability 7.5, AWS g4dn)"
    assert "g5 (A10G)" in hint and "p5 (H100)" in hint and "g7e (RTXPRO6000)" in hint


def test_a_filter_that_leaves_nothing_says_so(pick_here) -> None:
    proc = pick_here("p5", "--python", "3.11")
    assert proc.returncode == 8
    assert "nothing in matrix.yaml of Python 3.11 runs on" in proc.stderr


@pytest.mark.parametrize(
    "args, said",
    [
        ([], "name the node"),
        (["g5", "--here"], "name the node"),
        (["g5", "--index-url", "https://user:tok@host/fa"], "holds a login"),
        (["g5", "--index-url", "ftp://host/fa"], "not an http(s):// or file:// URL"),
        (["g5", "--dist", "nowhere"], "is not a directory"),
    ],
)
def test_bad_input_is_one_error_line(pick_here, args: list[str], said: str) -> None:
    proc = pick_here(*args)
    assert proc.returncode == 2, proc.stderr
    assert said in proc.stderr and "Traceback" not in proc.stderr
    assert "tok" not in proc.stderr


def test_here_without_a_gpu_is_the_machine_s_problem(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # no nvidia-smi
    proc = subprocess.run(
        [sys.executable, "-m", "fa_images", "pick", "--here", "--matrix", str(tmp_path / "m.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 3
    assert "no NVIDIA GPU visible" in proc.stderr


def test_plan_json_gives_each_entry_s_wheel(tmp_path: Path) -> None:
    (tmp_path / "matrix.yaml").write_text(FLEET)
    entries = matrix_mod.load(tmp_path / "matrix.yaml").entries
    wheels = {e.id: e.summary()["wheel"] for e in entries}
    assert wheels["fa2.8.3-py3.12-torch2.9.1-cu128-sm90"] == {
        "requirement": "flash-attn==2.8.3+cu128torch2.9cxx11abitrue.sm90",
        "file": "flash_attn-2.8.3+cu128torch2.9cxx11abitrue.sm90-cp312-cp312-*.whl",
        "index": "sm90/simple",
    }


def test_an_fa3_and_an_fa4_entry_name_their_own_project(tmp_path: Path) -> None:
    (tmp_path / "matrix.yaml").write_text(
        textwrap.dedent(
            """\
            entries:
              - {python: "3.12", torch: "2.9.1", cuda: "12.8", flash_attn: "3.0.0", target: [H100]}
              - {python: "3.12", torch: "2.11.0", flash_attn: "4.0.0b36", target: [H100]}
            """
        )
    )
    fa3, fa4 = matrix_mod.load(tmp_path / "matrix.yaml").entries
    assert fa3.requirement.startswith("flash-attn-3==3.0.0+cu12")
    assert fa3.wheel_file is not None and fa3.wheel_file.endswith("-*-abi3-*.whl")
    assert fa3.wheel_index == "simple"
    assert (fa4.requirement, fa4.wheel_file, fa4.wheel_index) == ("flash-attn-4==4.0.0b36", None, None)
    assert pick.from_entries([fa4])[0].lines("https://x.example")["pip"] == "pip install 'flash-attn-4==4.0.0b36'"


@pytest.mark.parametrize(
    "smi, capability, gpu",
    [
        ("NVIDIA H100 80GB HBM3", "9.0", "H100"),
        ("NVIDIA A10G", "8.6", "A10G"),  # the longest name it holds: not the A10
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "12.0", "RTXPRO6000"),
        ("NVIDIA GeForce RTX 3060", "8.6", "8.6"),  # a GPU the table lacks: its capability
    ],
)
def test_here_names_the_gpu_as_the_table_does(table, smi: str, capability: str, gpu: str) -> None:
    assert pick.named(table, smi, capability) == gpu


def test_here_asks_nvidia_smi_and_picks_for_each_gpu_of_the_node(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA A10G, 8.6'\necho 'NVIDIA A10G, 8.6'\n")
    smi.chmod(0o755)
    (tmp_path / "matrix.yaml").write_text(FLEET)
    proc = subprocess.run(
        [sys.executable, "-m", "fa_images", "pick", "--here", "--json", "--index-url", "https://x.example/fa"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr
    [found] = json.loads(proc.stdout)  # two GPUs of one kind: one node
    assert found["gpu"] == "A10G" and found["families"] == ["g5"]
    assert [o["entry"] for o in found["offers"]] == ["fa2.8.3-py3.12-torch2.9.1-cu128-sm80"]
