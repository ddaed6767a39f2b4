"""`fa-images init`: a commented starter matrix that `plan` loads, for this machine or a target;
never over a file that is there (without --force), never through a symlink."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from fa_images import cli, doctor
from fa_images.config import matrix
from fa_images.config.generations.fa3 import Fa3Recipe


def machine(entry: dict | None) -> doctor.Report:
    report = doctor.Report(entry=entry)
    report.facts = {"python": "3.12.3", "torch": {"version": "2.9.1+cu128"}, "gpus": [{"name": "NVIDIA L4"}]}
    if entry is None:
        report.add("matrix entry", doctor.WARN, "fa-images builds for Python 3.9, ..., not 3.8")
    return report


ENTRY = {"python": "3.12", "torch": "2.9.1", "flash_attn": "2.8.3", "archs": [80]}


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(doctor, "run", lambda python: machine(dict(ENTRY)))
    return tmp_path


def test_init_writes_a_commented_matrix_for_this_machine_that_plan_loads(here: Path, capsys) -> None:
    assert cli.main(["init"]) == 0
    text = (here / "matrix.yaml").read_text()
    assert "for this machine: Python 3.12.3, torch 2.9.1+cu128, NVIDIA L4" in text.splitlines()[0]
    assert '  - {python: "3.12", torch: "2.9.1", flash_attn: "2.8.3", archs: [80]}' in text
    assert "#   pull: missing" in text and "docker load -i" in text and "#   python: uv" in text
    (entry,) = matrix.load(here / "matrix.yaml").entries
    assert (entry.python, entry.torch, entry.cuda, entry.archs) == ("3.12", "2.9.1", "12.8", ("80",))
    said = capsys.readouterr().out.splitlines()  # what it chose and why, then what it wrote
    assert said[0] == "Python 3.12, torch 2.9.1+cu128 here: the torch of " + sys.executable
    chosen = "fa2.8.3-py3.12-torch2.9.1-cu128: CUDA 12.8, torch 2.9.1's default"
    assert said[1] == f"{chosen}; archs 80 (for this machine's GPUs: NVIDIA L4)"
    assert said[2].startswith("wrote matrix.yaml; next: fa-images plan")
    assert cli.main(["plan"]) == 0


def test_the_header_of_a_machine_without_torch_or_gpu_reads_right(here: Path, monkeypatch) -> None:
    """Issue 30: it read `torch no torch`."""
    bare = machine(dict(ENTRY))
    bare.facts = {"python": "3.12.3", "torch": None, "gpus": []}
    monkeypatch.setattr(doctor, "run", lambda python: bare)
    assert cli.main(["init"]) == 0
    first = (here / "matrix.yaml").read_text().splitlines()[0]
    assert first.endswith("`fa-images init` for this machine: Python 3.12.3, no torch, no GPU seen.")


@pytest.mark.parametrize(("target", "archs"), [("aws", ("80",)), ("H100", ("90",)), ("sm_89", ("80",))])
def test_init_for_a_target(here: Path, target: str, archs: tuple[str, ...]) -> None:
    assert cli.main(["init", "--target", target, "--out", "t.yaml"]) == 0
    text = (here / "t.yaml").read_text()
    assert f"for target {target}." in text.splitlines()[0] and f'target: ["{target}"]' in text
    (entry,) = matrix.load(here / "t.yaml").entries
    assert entry.archs == archs


def test_init_for_a_fleet_writes_an_entry_per_gpu_class_and_says_what_it_chose(here: Path, capsys) -> None:
    """Torch 2.9.1's default CUDA is 12.8, which sm_120 needs: no CUDA note; a torch on 12.6 gets one."""
    assert cli.main(["init", "--target", "g5", "--target", "g6e", "--target", "G7e", "--target", "p5"]) == 0
    text = (here / "matrix.yaml").read_text()
    assert "for targets g5, g6e, G7e, p5." in text.splitlines()[0]
    entries = matrix.load(here / "matrix.yaml").entries
    assert [(e.id, e.gpus) for e in entries] == [
        ("fa2.8.3-py3.12-torch2.9.1-cu128-sm80", ("A10G", "L40S")),
        ("fa2.8.3-py3.12-torch2.9.1-cu128-sm120", ("RTXPRO6000",)),
        ("fa2.8.3-py3.12-torch2.9.1-cu128-sm90", ("H100",)),
    ]
    said = capsys.readouterr().out.splitlines()
    assert said[0] == "Python 3.12, torch 2.9.1+cu128 here: the torch of " + sys.executable  # the fake doctor's
    sm120 = "fa2.8.3-py3.12-torch2.9.1-cu128-sm120"
    assert said[2] == f"{sm120}: CUDA 12.8, torch 2.9.1's default; archs 120 for RTXPRO6000"
    assert said[-1].startswith("wrote matrix.yaml")


def test_init_for_a_fleet_in_one_image_and_the_cuda_its_newest_gpu_needs(here: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(doctor, "run", lambda python: machine({**ENTRY, "torch": "2.7.1"}))
    assert cli.main(["init", "--target", "g5", "--target", "g7e", "--one-image"]) == 0
    (entry,) = matrix.load(here / "matrix.yaml").entries
    assert (entry.id, entry.archs, entry.cuda) == ("fa2.8.3-py3.12-torch2.7.1-cu128", ("80", "120"), "12.8")
    assert "CUDA 12.8, not torch 2.7.1's default 12.6: arch 120 needs CUDA >= 12.8" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ("L5", "neither a target nor a GPU fa-images knows"),
        ("T4", "compute capability 7.5) cannot run flash-attn 2"),
        ("aws\nimage: x", "is not a target name, an instance family or a GPU"),
        ("-rf", "is not a target name, an instance family or a GPU"),
    ],
)
def test_init_refuses_a_target_it_does_not_know(here: Path, capsys, target: str, says: str) -> None:
    assert cli.main(["init", f"--target={target}"]) == 2
    assert says in capsys.readouterr().err
    assert not (here / "matrix.yaml").exists()


def test_init_never_overwrites_without_force(here: Path, capsys) -> None:
    (here / "matrix.yaml").write_text("mine\n")
    assert cli.main(["init"]) == 2
    assert "matrix.yaml already exists; fa-images init does not overwrite it" in capsys.readouterr().err
    assert (here / "matrix.yaml").read_text() == "mine\n"
    assert cli.main(["init", "--force"]) == 0
    assert (here / "matrix.yaml").read_text().startswith("# The flash-attn images")
    assert [p.name for p in here.iterdir()] == ["matrix.yaml"]  # no temp file left


def test_init_never_writes_through_a_symlink(here: Path, capsys) -> None:
    victim = here / "victim"
    victim.write_text("keep\n")
    os.symlink(victim, here / "matrix.yaml")
    for args in (["init"], ["init", "--force"]):
        assert cli.main(args) == 2
        assert "is a symlink" in capsys.readouterr().err
    assert victim.read_text() == "keep\n" and (here / "matrix.yaml").is_symlink()
    linked_dir = here / "linked"
    linked_dir.symlink_to(here)
    assert cli.main(["init", "--out", "linked/m.yaml"]) == 2
    assert not (here / "m.yaml").exists()


def test_init_says_when_nothing_fits_this_machine(here: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(doctor, "run", lambda python: machine(None))
    assert cli.main(["init"]) == 3
    err = capsys.readouterr().err
    assert "error: no entry fits this machine: fa-images builds for Python 3.9" in err and "fa-images doctor" in err
    assert not (here / "matrix.yaml").exists()


def test_init_with_the_real_doctor(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(["init"]) == 0  # this machine, as doctor sees it (a CPU torch here)
    assert matrix.load(tmp_path / "matrix.yaml").entries


# --- FlashAttention-3 and -4 starters (issue 53) ---------------------------------------------------

NEW_TORCH = {"python": "3.12", "torch": "2.11.0", "flash_attn": "2.8.3", "archs": [80]}


@pytest.fixture
def new_torch(here: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    report = machine(dict(NEW_TORCH))
    h100 = {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}
    report.facts = {"python": "3.12.3", "torch": {"version": "2.11.0+cu130"}, "gpus": [h100, h100]}
    monkeypatch.setattr(doctor, "run", lambda python: report)
    return here


def test_init_writes_an_fa3_entry_with_its_knobs_and_where_its_archive_goes(new_torch: Path, capsys) -> None:
    assert cli.main(["init", "--flash-attn", "3.0.0", "--target", "H100"]) == 0
    text = (new_torch / "matrix.yaml").read_text()
    assert '  - {python: "3.12", torch: "2.11.0", flash_attn: "3.0.0", target: ["H100"]}' in text
    assert "# fa3:\n#   head_dims: [128]" in text and "packages:\n  sdists: sources" in text
    (entry,) = matrix.load(new_torch / "matrix.yaml").entries
    assert isinstance(entry.recipe, Fa3Recipe) and entry.recipe.build.full and entry.gpus == ("H100",)
    assert "fa3.0.0-py3.12-torch2.11.0-cu130: CUDA 13.0" in capsys.readouterr().out


def test_init_writes_an_fa4_entry_per_arch_it_compiles_for(new_torch: Path) -> None:
    """FA4 compiles for each GPU's own arch (sm_86, sm_89, sm_90a): g5 and g6e are two classes."""
    args = ["--target", "g5", "--target", "A10G", "--target", "g6e", "--target", "p5", "--target", "p5e"]
    assert cli.main(["init", "--flash-attn", "4.0.0b36", *args]) == 0
    entries = matrix.load(new_torch / "matrix.yaml").entries
    assert [e.gpus for e in entries] == [("A10G",), ("L40S",), ("H100", "H200")]
    assert all(e.generation.number == 4 for e in entries)
    assert "# fa4:\n#   head_dims: [64, 128]" in (new_torch / "matrix.yaml").read_text()


def test_init_for_fa4_without_a_target_takes_this_machines_gpu(new_torch: Path) -> None:
    assert cli.main(["init", "--flash-attn", "4.0.0b36"]) == 0
    (entry,) = matrix.load(new_torch / "matrix.yaml").entries
    assert entry.gpus == ("H100",) and entry.generation.number == 4


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--flash-attn", "9.0.0", "--target", "H100"], "names FlashAttention-9, which fa-images does not build"),
        (["--flash-attn", "3.0.0", "--target", "L4", "--target", "T4"], "--flash-attn 3.0.0: "),
        (["--flash-attn", "not-a-version"], "is not a valid flash-attn version"),
    ],
)
def test_init_refuses_a_generation_the_target_or_torch_cannot_have(new_torch: Path, capsys, args, says) -> None:
    assert cli.main(["init", *args]) == 2
    err = capsys.readouterr().err
    assert says in err and err.startswith("error: ") and not (new_torch / "matrix.yaml").exists()


def test_init_for_fa3_on_a_machine_without_a_gpu_asks_for_a_target(here: Path, monkeypatch, capsys) -> None:
    bare = machine(dict(NEW_TORCH))
    bare.facts = {"python": "3.12.3", "torch": None, "gpus": []}
    monkeypatch.setattr(doctor, "run", lambda python: bare)
    assert cli.main(["init", "--flash-attn", "3.0.0"]) == 2
    assert "FlashAttention-3 needs a target, and no GPU is seen here" in capsys.readouterr().err
