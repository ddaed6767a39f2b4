"""A mixed fleet: AWS instance families as targets, kept in agreement with the GPU table; the CUDA a
target needs; `fa-images gpus`, which lists them and says what a matrix covers."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from packaging.version import Version

from fa_images.config import compat as compat_mod
from fa_images.config import matrix as matrix_mod
from fa_images.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
# AWS's GPU instance families in 2026, and the compute capability of each one's GPU.
FAMILIES = {
    "g5": "8.6", "g6": "8.9", "g6e": "8.9", "g7": "12.0", "g7e": "12.0", "p4d": "8.0", "p4de": "8.0",
    "p5": "9.0", "p5e": "9.0", "p5en": "9.0", "p6-b200": "10.0", "p6-b300": "10.3",
}  # fmt: skip
GRACE = {"p6e-gb200": "10.0", "p6e-gb300": "10.3"}


@pytest.fixture(scope="module")
def table() -> compat_mod.Compat:
    return compat_mod.load()


def test_the_gpu_table_the_instance_families_and_the_targets_agree(table: compat_mod.Compat) -> None:
    for family, capability in {**FAMILIES, **GRACE}.items():
        instance = table.instances[family]
        assert table.capability_of(instance.gpu) == capability, family
        assert instance.cpu == ("aarch64" if family in GRACE else "x86_64"), family
    assert table.capability_of(table.instances["g4dn"].gpu) == "7.5"  # T4: listed, refused
    for name, gpus in table.targets.items():
        assert all(table.capability_of(g) for g in gpus), name
    names = [compat_mod.gpu_key(n) for n in [*table.targets, *table.instances]] + list(table.gpus)
    assert len(names) == len(set(names)), "a target name that means two things"
    # Every GPU flash-attn runs on has the arch of its major in the arch table.
    for gpu, capability in table.gpus.items():
        if Version(capability) >= Version("8.0"):
            assert table.arch_for_capability(capability), gpu


def _compat_problems(tmp_path: Path, text: str) -> list[str]:
    (tmp_path / "c.yaml").write_text(textwrap.dedent(text))
    with pytest.raises(ConfigError) as info:
        compat_mod.load(tmp_path / "c.yaml")
    return [p.message for p in info.value.problems]


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("instances:\n  g9: {gpu: X999}\n", "instance family 'g9' names a GPU the gpus section lacks: 'X999'"),
        (
            "instances:\n  g9: {gpu: L4, cpu: riscv}\n",
            "instance family 'g9': cpu 'riscv' is not one of x86_64, aarch64",
        ),
        ("instances:\n  l4: {gpu: L4}\n", "instance family 'l4' is also a GPU or a target name"),
        ("instances:\n  aws: {gpu: L4}\n", "instance family 'aws' is also a GPU or a target name"),
        ("instances:\n  'g9;rm': {gpu: L4}\n", "instance family 'g9;rm' must be a name such as g6e or p6-b200"),
        ("instances:\n  g9: {gpu: L4, price: 3}\n", "instance family 'g9': only gpu and cpu, not ['price']"),
    ],
)
def test_an_instance_family_the_table_cannot_hold_is_refused(tmp_path: Path, override: str, said: str) -> None:
    assert said in _compat_problems(tmp_path, override)


def _matrix(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text("image: example.com/fa\n" + textwrap.dedent(body))
    return path


def _entries(tmp_path: Path, body: str):
    return matrix_mod.load(_matrix(tmp_path, body)).entries


@pytest.mark.parametrize(
    ("target", "archs", "gpus"),
    [
        ("[g5, g6, g6e]", ("80",), ("A10G", "L4", "L40S")),
        ("G7e", ("120",), ("RTXPRO6000",)),  # as AWS writes it
        ("[p5, p5en, p6-b200]", ("90", "100"), ("H100", "H200", "B200")),
        ("p6-b300", ("100",), ("B300",)),  # 10.3 runs the sm_100 kernels
    ],
)
def test_an_instance_family_is_a_target(tmp_path: Path, target: str, archs, gpus) -> None:
    (entry,) = _entries(
        tmp_path, f'entries:\n  - {{python: "3.12", torch: "2.9.1", flash_attn: "2.8.3", target: {target}}}\n'
    )
    assert entry.archs == archs and entry.gpus == gpus


@pytest.mark.parametrize(
    ("target", "said"),
    [
        ("g4dn", "g4dn's T4 (compute capability 7.5) cannot run flash-attn 2"),
        ("p6e-gb200", "p6e-gb200 is an aarch64 instance family (GB200): fa-images builds x86_64 images"),
        ("g8", "unknown GPU or target 'g8'"),
    ],
)
def test_a_family_that_cannot_be_built_is_refused_with_its_reason(tmp_path: Path, target: str, said: str) -> None:
    path = _matrix(
        tmp_path, f'entries:\n  - {{python: "3.12", torch: "2.9.1", flash_attn: "2.8.3", target: {target}}}\n'
    )
    with pytest.raises(ConfigError) as info:
        matrix_mod.load(path)
    assert [p.message for p in info.value.problems] == [said]


def test_a_target_that_needs_a_newer_cuda_takes_the_oldest_build_of_its_torch_that_has_it(tmp_path: Path) -> None:
    body = 'matrix:\n  python: ["3.12"]\n  torch: ">=2.6"\n  flash_attn: ["2.8.3"]\n  target: [RTXPRO6000]\n'
    loaded = matrix_mod.load(_matrix(tmp_path, body))
    by_torch = {e.torch: e for e in loaded.entries}
    assert by_torch["2.7.1"].cuda == "12.8" and by_torch["2.8.0"].cuda == "12.8"
    assert by_torch["2.7.1"].cuda_note == "CUDA 12.8, not torch 2.7.1's default 12.6: arch 120 needs CUDA >= 12.8"
    assert by_torch["2.8.0"].cuda_note is None  # its default already is 12.8
    # 2.6.0 has no CUDA 12.8 build: left out with the arch's reason, not planned on a CUDA it lacks.
    assert [lo.reason for lo in loaded.left_out if "torch=2.6.0" in lo.combination] == [
        "arch 120 needs CUDA >= 12.8, not 12.4"
    ]
    plan = subprocess.run(
        [sys.executable, "-m", "fa_images", "plan", "--matrix", str(tmp_path / "matrix.yaml")],
        capture_output=True, text=True, cwd=REPO, check=True,
    )  # fmt: skip
    assert "CUDA 12.8, not torch 2.7.1's default 12.6: arch 120 needs CUDA >= 12.8" in plan.stdout
    assert "fa2.8.3-py3.12-torch2.7.1-cu128" in plan.stdout and "for RTXPRO6000" in plan.stdout


def test_a_cuda_written_in_the_matrix_is_never_changed(tmp_path: Path) -> None:
    body = 'entries:\n  - {python: "3.12", torch: "2.7.1", cuda: "12.6", flash_attn: "2.8.3", target: RTXPRO6000}\n'
    with pytest.raises(ConfigError) as info:
        matrix_mod.load(_matrix(tmp_path, body))
    assert [p.message for p in info.value.problems] == ["arch 120 needs CUDA >= 12.8, this entry uses 12.6"]


def _gpus(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fa_images", "gpus", *args], capture_output=True, text=True, cwd=REPO)


def test_gpus_lists_every_gpu_and_family_with_the_arch_it_needs() -> None:
    proc = _gpus()
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines()[1:] if not line.startswith("target ")}
    assert rows["RTXPRO6000"][:4] == ["RTXPRO6000", "12.0", "sm_120", "g7e"]
    assert rows["L40S"][:4] == ["L40S", "8.9", "sm_80", "g6e"]
    assert rows["T4"][:4] == ["T4", "7.5", "none", "(needs"] and rows["T4"][-1] == "g4dn"
    assert "p6e-gb200 (aarch64, not built)" in proc.stdout
    data = json.loads(_gpus("--json").stdout)
    assert {"gpu": "H200", "compute_capability": "9.0", "arch": "90", "instance_families": ["p5e", "p5en"],
            "aarch64_families": []} in data  # fmt: skip


def test_gpus_with_a_matrix_says_which_families_it_runs_on_and_misses(tmp_path: Path) -> None:
    path = _matrix(
        tmp_path, 'entries:\n  - {python: "3.12", torch: "2.9.1", flash_attn: "2.8.3", target: [g5, g6e, p5]}\n'
    )
    proc = _gpus("--matrix", str(path))
    assert proc.returncode == 0, proc.stderr
    covered = {"g5", "g6", "g6e", "p4d", "p4de", "p5", "p5e", "p5en"}  # sm_80 and sm_90 run on every 8.x and 9.0
    lines = proc.stdout.splitlines()
    runs_on = next(line for line in lines if line.startswith(f"{path} runs on "))
    assert set(runs_on.removeprefix(f"{path} runs on ").split(", ")) == covered
    said = next(line for line in lines if line.startswith("and not on "))
    assert {f.strip() for f in said.removeprefix("and not on ").split("(")[0].split(",")} == {
        "g7",
        "g7e",
        "p6-b200",
        "p6-b300",
    }
    data = json.loads(_gpus("--matrix", str(path), "--json").stdout)
    assert next(r for r in data if r["gpu"] == "B200")["entries"] == []
    assert next(r for r in data if r["gpu"] == "L4")["entries"] == ["fa2.8.3-py3.12-torch2.9.1-cu128"]


# ----------------------------------------------------------------------------- an image per GPU class

CLASSES = 'matrix:\n  python: ["3.12"]\n  torch: ["2.9.1"]\n  flash_attn: ["2.8.3"]\n  target: {targets}\n'


def test_a_target_axis_of_several_classes_gives_an_entry_an_image_and_a_wheel_per_class(tmp_path: Path) -> None:
    entries = _entries(tmp_path, CLASSES.format(targets="[[g5, g6e], g7e, p5]"))
    base = "fa2.8.3-py3.12-torch2.9.1-cu128"
    assert [(e.id, e.archs, e.gpus, e.gpu_class) for e in entries] == [
        (f"{base}-sm80", ("80",), ("A10G", "L40S"), "sm80"),
        (f"{base}-sm120", ("120",), ("RTXPRO6000",), "sm120"),
        (f"{base}-sm90", ("90",), ("H100",), "sm90"),
    ]
    assert entries[0].image == f"example.com/fa:{base}-sm80"
    assert [e.wheel_label() for e in entries] == [
        "cu128torch2.9cxx11abitrue.sm80", "cu128torch2.9cxx11abitrue.sm120", "cu128torch2.9cxx11abitrue.sm90"
    ]  # fmt: skip
    assert len({e.compile_group for e in entries}) == 3


def test_a_matrix_of_one_class_keeps_todays_names(tmp_path: Path) -> None:
    (entry,) = _entries(tmp_path, CLASSES.format(targets="[[g5, g6e, g7e]]"))
    assert entry.id == "fa2.8.3-py3.12-torch2.9.1-cu128" and entry.gpu_class is None
    assert entry.archs == ("80", "120") and entry.wheel_label() == "cu128torch2.9cxx11abitrue"


def test_two_targets_of_one_class_are_one_entry_written_twice(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        matrix_mod.load(_matrix(tmp_path, CLASSES.format(targets="[g5, g6e, g7e]")))
    (problem,) = info.value.problems
    assert problem.message.endswith("already builds: both are GPU class sm80")
    assert problem.hint == "name GPUs of one class in one target value, e.g. target: [[g5, g6e], g7e]"


def test_the_builder_is_told_to_name_the_class_in_the_wheel_only_where_the_matrix_has_several(tmp_path: Path) -> None:
    from fa_images.config import builder_decision
    from fa_images.outputs import render

    several = matrix_mod.load(_matrix(tmp_path, CLASSES.format(targets="[g5, g7e]")))
    (tmp_path / "one").mkdir()
    one = matrix_mod.load(_matrix(tmp_path / "one", CLASSES.format(targets="[g7e]")))
    form = builder_decision.decide("sdk", memory_limit=False, host=None).form
    for entry in several.entries:
        assert "      --label-archs \\\n" in render.render_entry(several, entry, builder=form)
    assert "--label-archs" not in render.render_entry(one, one.entries[0], builder=form)
