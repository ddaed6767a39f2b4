"""The words fa-images prints: every exit code of build in --help, the CPU-torch hint taken from
the torch installed, doctor's verdict following its own marks, counts in the singular."""

from __future__ import annotations

from pathlib import Path

import pytest

from fa_images import cli, doctor
from fa_images.builder import environment
from fa_images.builder.errors import EnvironmentProblem
from fa_images.builder.wording import counted


def test_build_help_lists_every_exit_code(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["build", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for code in ("0 when every selected entry succeeded", "1 when some failed", "2 bad input", "3 the base images"):
        assert code in text
    for code in ("7 no engine", "70 a bug", "130 interrupted", "--pull {missing,always,never}"):
        assert code in text


def cpu_torch(version: str) -> environment.TorchInfo:
    return environment.TorchInfo(version=f"{version}+cpu", cuda=None, cxx11_abi=True, python="3.11")


@pytest.mark.parametrize(("torch", "nvcc", "command"), [("2.13.0", "13.0", "cu130"), ("2.6.0", "12.4", "cu124")])
def test_the_cpu_torch_hint_names_the_cuda_build_of_the_torch_installed(torch: str, nvcc: str, command: str) -> None:
    with pytest.raises(EnvironmentProblem) as refused:
        environment.check_toolchain(cpu_torch(torch), environment.NvccInfo(Path("/opt/cuda/bin/nvcc"), nvcc))
    hint = refused.value.hint or ""
    assert hint.startswith(f"pip install torch=={torch} --index-url https://download.pytorch.org/whl/{command} ")
    assert "2.9.1" not in hint or torch == "2.9.1"


def test_doctor_and_wheel_share_the_hint(monkeypatch) -> None:
    from fa_images.config import compat

    monkeypatch.setattr(environment, "probe_torch", lambda python: cpu_torch("2.13.0"))
    report = doctor.Report()
    doctor.probe_torch(report, "python", compat.load())
    (finding,) = report.findings
    assert finding.fix == environment.cuda_torch_command("2.13.0", "cu130")  # its PyPI default CUDA


@pytest.mark.parametrize(
    ("statuses", "verdict", "ok"),
    [
        ([doctor.OK, doctor.INFO], "all is well", True),
        ([doctor.OK, doctor.WARN], "1 problem: a1", False),  # a CPU torch is not "all is well"
        ([doctor.FAIL, doctor.WARN, doctor.OK], "2 problems: a0, a1", False),
    ],
)
def test_doctor_verdict_follows_its_marks(statuses: list[str], verdict: str, ok: bool) -> None:
    report = doctor.Report()
    for i, status in enumerate(statuses):
        report.add(f"a{i}", status, "detail")
    assert report.lines()[-1] == verdict and report.ok is ok


def test_doctor_exits_1_under_a_warning(monkeypatch, capsys) -> None:
    report = doctor.Report()
    report.add("torch", doctor.WARN, "2.13.0+cpu, a CPU build", fix="pip install torch==2.13.0 ...")
    monkeypatch.setattr(doctor, "run", lambda python: report)
    assert cli.main(["doctor"]) == 1
    assert capsys.readouterr().out.rstrip().endswith("1 problem: torch")


@pytest.mark.parametrize(
    ("count", "noun", "text"),
    [(1, "entry", "1 entry"), (2, "entry", "2 entries"), (1, "wheel", "1 wheel"), (0, "wheel", "0 wheels")],
)
def test_counts(count: int, noun: str, text: str) -> None:
    assert counted(count, noun) == text


def test_one_entry_is_singular(tmp_path: Path, monkeypatch, capsys) -> None:
    (tmp_path / "matrix.yaml").write_text(
        'entries: [{python: "3.12", torch: "2.9.1", flash_attn: "2.8.3", archs: [80]}]\n'
    )
    monkeypatch.chdir(tmp_path)
    assert cli.main(["plan"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "1 entry in 1 compile group (entries that share kernels)"
