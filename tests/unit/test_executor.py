"""The executor's error paths, against a fake engine (fast; the real engine is in test_build_engine.py).

The fake cannot run a build, so the verifier is replaced where a test needs an exported wheel
to be accepted; every real acceptance goes through the real verifier in the engine tests.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path

import fakes
import pytest
from fakes import WHEEL, FakeEngine, accept_every_wheel

from fa_images.builder import contract
from fa_images.config import matrix
from fa_images.run import executor as executor_mod
from fa_images.run import plan
from fa_images.run.executor import Executor, Options
from fa_images.run.logger import Console

REPO = Path(__file__).resolve().parents[2]


def execute(
    m: matrix.Matrix, engine: FakeEngine, tmp_path: Path, push: bool = False, **options
) -> list[executor_mod.EntryResult]:
    out = io.StringIO()
    opts = Options(dist=tmp_path / "dist", log_dir=tmp_path / "logs", **options)
    return fakes.execute(m, engine, opts, Console(out), push=push, gpus=opts.gpus.mode)[1]


def test_one_failure_does_not_stop_the_others(tiny_matrix, tmp_path, monkeypatch) -> None:
    accept_every_wheel(monkeypatch)
    results = execute(tiny_matrix, FakeEngine(fail_build={"py3.11"}), tmp_path)
    assert [r.status for r in results] == ["failed", "ok"]
    assert results[0].failed_step == "build" and "error: boom" in results[0].error
    assert "fa-images: build failed: step 9/21" in Path(results[0].log).read_text()
    assert results[1].wheel == str((tmp_path / "dist" / WHEEL).resolve())


def test_fail_fast_stops_at_the_first_failure(tiny_matrix, tmp_path, monkeypatch) -> None:
    accept_every_wheel(monkeypatch)
    results = execute(tiny_matrix, FakeEngine(fail_build={"py3.11"}), tmp_path, fail_fast=True)
    assert [r.status for r in results] == ["failed", "not run"]


def test_a_wheel_that_fails_verification_never_reaches_dist(tiny_matrix, tmp_path) -> None:
    results = execute(tiny_matrix, FakeEngine(), tmp_path)  # the real verifier: the fake wheel is junk
    assert {r.status for r in results} == {"failed"} and {r.failed_step for r in results} == {"export"}
    assert list((tmp_path / "dist").iterdir()) == []  # no wheel, no manifest, no staging dir


def test_manifest_records_each_wheel_and_keeps_earlier_runs(tiny_matrix, tmp_path, monkeypatch) -> None:
    accept_every_wheel(monkeypatch)
    dist = tmp_path / "dist"
    dist.mkdir()
    older = "flash_attn-2.8.2+cu128torch2.9cxx11abitrue-cp312-cp312-linux_x86_64.whl"
    (dist / older).write_bytes(b"an earlier run's wheel")
    record = {"sha256": hashlib.sha256(b"an earlier run's wheel").hexdigest(), "size": 22}
    record |= {"flash_attn": "2.8.2", "python": "3.12"}
    (dist / "manifest.json").write_text(json.dumps({"schema_version": 1, "wheels": {older: record}}))
    execute(tiny_matrix, FakeEngine(), tmp_path)
    wheels = json.loads((dist / "manifest.json").read_text())["wheels"]
    assert set(wheels) == {older, WHEEL}
    assert wheels[WHEEL]["sha256"] == "ab" * 32 and wheels[WHEEL]["entry"].endswith("py3.12-torch2.9.1-cu128")


def test_a_failed_push_is_never_shown_as_done(tiny_matrix, tmp_path, monkeypatch) -> None:
    accept_every_wheel(monkeypatch)
    results = execute(tiny_matrix, FakeEngine(fail_push=True), tmp_path, push=True)
    assert all(r.status == "failed" and r.failed_step == "push" and r.pushed is None for r in results)


def test_gpu_check_is_skipped_without_a_gpu_runtime(tiny_matrix, tmp_path, monkeypatch) -> None:
    accept_every_wheel(monkeypatch)
    engine = FakeEngine(gpu=False)
    results = execute(tiny_matrix, engine, tmp_path)
    assert all(r.gpu_check.startswith("skipped") and r.check == "passed" for r in results)
    assert not [c for c in engine.calls if c[0] == "run" and c[3]]


def test_gpu_check_runs_with_a_gpu_runtime(tiny_matrix, tmp_path, monkeypatch) -> None:
    accept_every_wheel(monkeypatch)
    engine = FakeEngine(gpu=True, gpu_exit=0)
    results = execute(tiny_matrix, engine, tmp_path)
    assert all(r.gpu_check == "passed" for r in results)
    assert ("run", results[0].image, contract.GPU_CHECK_COMMAND, True) in engine.calls


@pytest.mark.parametrize(
    ("code", "status", "gpu_check"), [(3, "ok", "skipped: no GPU visible in the container"), (1, "failed", "not run")]
)
def test_gpu_check_outcomes(tiny_matrix, tmp_path, monkeypatch, code, status, gpu_check) -> None:
    accept_every_wheel(monkeypatch)
    results = execute(tiny_matrix, FakeEngine(gpu=True, gpu_exit=code), tmp_path, keep_container=True)
    assert results[0].status == status and results[0].gpu_check == gpu_check
    if status == "failed":  # the engine says how to enter the kept container
        assert "kept for debugging: fake-engine enter fa-images-kept" in results[0].error
        assert results[0].kept_container == "fa-images-kept"


def test_a_wrong_arch_gpu_skips_the_gpu_check_with_its_reason(tiny_matrix, tmp_path, monkeypatch) -> None:
    """An archs-80 image on an H100 build host: the check's WRONG ARCH (exit 8) is skipped, not failed,
    with the check's reason in the result, the JSON report and under the summary table."""
    from fa_images.run.report import print_summary, write_report

    accept_every_wheel(monkeypatch)
    said = "this GPU is sm_90; the extension carries sm_80, which runs on compute capability 8.0 to 8.x (sm_80)"
    engine = FakeEngine(gpu=True, gpu_exit=contract.EXIT_WRONG_ARCH, gpu_output=[f"WRONG ARCH: {said}\x1b[2J"])
    results = execute(tiny_matrix, engine, tmp_path)
    assert [r.status for r in results] == ["ok", "ok"]
    assert {r.gpu_check for r in results} == {"skipped: this GPU cannot run the image's GPU code"}
    assert results[0].gpu_check_reason.startswith(said) and "\x1b" not in results[0].gpu_check_reason
    assert "; GPUs that run it: A100 (AWS p4d, p4de), " in results[0].gpu_check_reason
    assert "A10G (AWS g5)" in results[0].gpu_check_reason and "H100" not in results[0].gpu_check_reason
    write_report(tmp_path / "report.json", results, "fake engine")
    entry = json.loads((tmp_path / "report.json").read_text())["entries"][0]
    assert entry["gpu_check"] == "skipped: this GPU cannot run the image's GPU code"
    assert entry["gpu_check_reason"] == results[0].gpu_check_reason
    out = io.StringIO()
    print_summary(Console(out), results)
    assert f"{results[0].id}: skipped: this GPU cannot run the image's GPU code: {said}" in out.getvalue()
    assert "2 of 2 entries succeeded" in out.getvalue()


def test_ctrl_c_marks_the_entry_and_propagates(tiny_matrix, tmp_path, monkeypatch) -> None:
    accept_every_wheel(monkeypatch)
    engine = FakeEngine(interrupt_on="py3.12")
    builder = fakes.FakeBuilder(engine)
    ex = Executor(
        engine, builder, tiny_matrix, Options(dist=tmp_path / "dist", log_dir=tmp_path / "logs"), Console(io.StringIO())
    )
    with pytest.raises(KeyboardInterrupt):
        ex.run(plan.make_plan(tiny_matrix.entries, form=builder.form, compiler_cache=False))
    assert [r.status for r in ex.results] == ["ok", "interrupted"]
    assert [p.name for p in (tmp_path / "dist").iterdir()] and not any(
        p.name.startswith(".") for p in (tmp_path / "dist").iterdir()
    )


def test_build_dry_run_prints_the_plan_as_json() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fa_images", "build", "--dry-run", "--json", "--push"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    plans = json.loads(proc.stdout)
    assert len(plans) == 4 and plans[0]["steps"] == ["source", "build", "export", "check", "gpu-check", "push"]


def test_build_only_an_unknown_entry_is_a_usage_error() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fa_images", "build", "--only", "fa2.8.3-py3.12-torch2.9.1-cu12"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "did you mean 'fa2.8.3-py3.12-torch2.9.1-cu128'" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("form", ["buildkit", "sdk"])
def test_a_field_the_builder_cannot_fill_is_absent_with_its_reason(tiny_matrix, tmp_path, monkeypatch, form) -> None:
    """The legacy builder names each stage's image; BuildKit names none: its report has no
    torch_stage, and says why, rather than a null a pipeline would read as 'none'."""
    from fa_images.run.report import write_report

    accept_every_wheel(monkeypatch)
    engine = FakeEngine()
    options = Options(dist=tmp_path / "dist", log_dir=tmp_path / "logs")
    _, results = fakes.execute(
        tiny_matrix, engine, options, Console(io.StringIO()), builder=fakes.FakeBuilder(engine, form)
    )
    write_report(tmp_path / "report.json", results, "fake engine")
    entries = json.loads((tmp_path / "report.json").read_text())["entries"]
    if form == "sdk":
        assert all(e["torch_stage"] and e["absent"] == {} for e in entries)
    else:
        assert all(
            "torch_stage" not in e and "names no image of the torch stage" in e["absent"]["torch_stage"]
            for e in entries
        )
