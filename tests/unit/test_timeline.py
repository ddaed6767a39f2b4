"""Where a wheel build's time goes: the builder's phases, the shim's marks, and the one line that carries them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fixtures.tiny import make_tiny_sdist
from test_elf_versions import make_elf

from fa_images.builder import build, cli, contract, environment
from fa_images.builder.setup_shim import _platform_of
from fa_images.builder.timeline import Timeline


def test_a_phase_lasts_from_the_mark_before_it() -> None:
    timeline = Timeline(started=100.0)
    timeline.mark("sdist", at=101.5)
    timeline.mark("ninja", at=150.0)
    timeline.mark("verify", at=154.25)
    assert timeline.phases() == [("sdist", 1.5), ("ninja", 48.5), ("verify", 4.25)]


def test_marks_from_another_process_fall_into_place_and_a_repeated_phase_is_summed() -> None:
    """The shim's marks arrive after the builder's own mark that preceded them in time: sorted by time."""
    timeline = Timeline(started=0.0)
    timeline.mark("setup.py build_ext", at=2.0)
    timeline.mark("ninja", at=10.0)
    timeline.mark("setup.py build_ext", at=11.0)
    timeline.mark("link", at=13.0)
    timeline.mark("toolchain probe", at=1.0)
    assert timeline.phases() == [("toolchain probe", 1.0), ("setup.py build_ext", 2.0), ("ninja", 8.0), ("link", 2.0)]


def test_the_phases_line_says_the_time_outside_the_compile_and_reads_back() -> None:
    phases = [("sdist", 2.0), ("setup.py start", 3.5), (contract.COMPILE_PHASE, 1180.2), ("wheel zip", 9.1)]
    line = contract.phases_line(phases)
    assert line.startswith(contract.MILESTONE)  # shown live by `build`
    assert line.endswith("; outside ninja 14.6 s")
    assert contract.parse_phases(f"12:00:01 {line}") == phases
    assert contract.parse_phases("[fa-images] wheel dist/x.whl (62.7 MB) built in 1305 s") is None


def test_the_shims_mark_reads_back_and_nothing_else_does() -> None:
    line = contract.phase_mark_line("setup.py egg_info", 1700000000.25)
    assert contract.parse_phase_mark(line) == ("setup.py egg_info", 1700000000.25)
    for other in ("[fa-images] platform tag manylinux_2_34_x86_64: ...", "running build_ext", line.split(" ", 2)[0]):
        assert contract.parse_phase_mark(other) is None


@pytest.mark.parametrize(("glibc", "platform"), [("2.27", "manylinux_2_27_x86_64"), ("2.99", "linux_x86_64")])
def test_the_wheel_is_named_for_its_extension_before_it_is_zipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], glibc: str, platform: str
) -> None:
    """What bdist_wheel's tag becomes under the shim: the policy the installed extension allows,
    so the finished wheel needs no second zip (manylinux.tag_wheel) to be renamed."""
    (tmp_path / "flash_attn_2_cuda.cpython-312-x86_64-linux-gnu.so").write_bytes(
        make_elf({"libc.so.6": [f"GLIBC_{glibc}", "GLIBC_2.2.5"]})
    )
    assert _platform_of(tmp_path, "linux_x86_64") == platform
    said = capsys.readouterr().out
    assert said.startswith(f"[fa-images] platform tag {'stays ' if platform == 'linux_x86_64' else ''}{platform}: ")


def test_without_one_extension_the_tag_stays(tmp_path: Path) -> None:
    assert _platform_of(tmp_path, "linux_x86_64") == "linux_x86_64"


def test_torch_is_probed_once_for_prepare_and_compile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each probe imports torch in a child Python (3 to 4 s on the GPU machine); ``wheel`` probes
    once and hands the answer to both steps."""
    probe = environment.probe_torch  # the unit tier's cached one
    calls: list[str] = []

    def counted(python: str = sys.executable) -> environment.TorchInfo:
        calls.append(python)
        return probe(python)

    monkeypatch.setattr(environment, "probe_torch", counted)
    compiled: dict = {}
    monkeypatch.setattr(build, "compile_wheel", lambda settings, out, **kwargs: compiled.update(kwargs))
    sdist = make_tiny_sdist(tmp_path / "in")
    assert cli.main(["wheel", "--sdist", str(sdist), "--out", str(tmp_path / "dist")]) == 0, capsys.readouterr().err
    assert len(calls) == 1
    assert compiled["torch"] == probe(calls[0])  # the compile does not probe again
    assert compiled["timeline"].marks[0][0] == "torch probe"
