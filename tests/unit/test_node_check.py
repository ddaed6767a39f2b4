"""`fa-images check IMAGE…` against the fake engine: each verdict and its exit code, the worst of
several, the JSON shape, pulls, and hostile refs and labels. The real engine runs it in
tests/engine/test_build_engine.py (no GPU on that machine: the no-GPU verdict)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import FakeEngine

from fa_images import cli
from fa_images.builder import contract
from fa_images.commands import check as check_command
from fa_images.run import gpus, node_check
from fa_images.run.engine import DockerEngine, RunResult

IMAGE = "ghcr.io/acme/flash-attn:2.8.3-py3.12-torch2.9.1-cu128"
LABELS = {
    "fa-images.flash-attn": "2.8.3",
    "fa-images.torch": "2.9.1",
    "fa-images.cuda": "12.8",
    "fa-images.python": "3.12",
    "fa-images.archs": "80",
    "fa-images.entry": "fa2.8.3-py3.12-torch2.9.1-cu128",
}
OUTPUT = {  # what the image's check prints before its verdict line, with a GPU
    0: ["GPU: NVIDIA A10G (sm_86)", "GPU code: this GPU (sm_86) runs the sm_80 cubin", "PASS: 17 comparisons"],
    1: ["GPU: NVIDIA A10G (sm_86)", "FAIL: 2 of 17 comparisons out of tolerance (3.1 s)"],
    8: ["GPU: NVIDIA H100 80GB HBM3 (sm_90)", "WRONG ARCH: this GPU is sm_90; the extension carries sm_80"],
}


class Node(FakeEngine):
    """A node whose images answer the GPU check each with its own exit code (as their check would)."""

    def __init__(self, exits: dict[str, int], **kw) -> None:
        super().__init__(gpu=True, **kw)
        self.exits = exits
        for ref in exits:
            self.labels[ref] = dict(LABELS)

    def run(self, image, command, *, gpu, keep, on_line) -> RunResult:
        self.calls.append(("run", image, tuple(command), gpu))
        code = self.exits[image] if gpu else contract.EXIT_NO_GPU
        lines = ["flash_attn 2.8.3 imports next to torch 2.9.1"]
        lines += OUTPUT.get(code, []) if gpu else ["NO GPU: torch sees no CUDA device; the GPU check was not run"]
        return RunResult(code, lines)


def check(monkeypatch, engine: FakeEngine, *args: str) -> int:
    monkeypatch.setattr(DockerEngine, "from_env", classmethod(lambda cls: engine))
    return cli.main(["check", *args])


@pytest.mark.parametrize(
    ("code", "verdict", "exit_code"),
    [(0, "pass", 0), (1, "fail", 1), (8, "wrong arch", 8), (125, "fail", 1)],
    ids=["pass", "fail", "wrong arch", "an engine-level exit"],
)
def test_each_verdict_and_its_exit_code(monkeypatch, capsys, code: int, verdict: str, exit_code: int) -> None:
    engine = Node({IMAGE: code})
    assert check(monkeypatch, engine, IMAGE) == exit_code
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"{IMAGE}: {verdict.upper()} · ")
    assert "flash-attn 2.8.3, torch 2.9.1, CUDA 12.8" in line
    if code in OUTPUT:
        assert OUTPUT[code][0].removeprefix("GPU: ") in line and OUTPUT[code][-1] in line
    assert ("run", IMAGE, contract.GPU_CHECK_COMMAND, True) in engine.calls


def test_no_gpu_is_its_own_verdict(monkeypatch, capsys) -> None:
    engine = Node({IMAGE: 0})
    assert check(monkeypatch, engine, IMAGE, "--gpus", "none") == contract.EXIT_NO_GPU == 3
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"{IMAGE}: NO GPU · no GPU seen · flash-attn 2.8.3")
    assert line.endswith("NO GPU: torch sees no CUDA device; the GPU check was not run (--gpus none)")
    assert ("run", IMAGE, contract.GPU_CHECK_COMMAND, False) in engine.calls


def test_without_a_gpu_runtime_the_check_runs_without_gpus_and_says_why(monkeypatch, capsys) -> None:
    engine = Node({IMAGE: 0})
    engine.gpu = False  # no NVIDIA Container Toolkit
    assert check(monkeypatch, engine, IMAGE) == 3
    assert "(the engine has no GPU runtime (NVIDIA Container Toolkit)" in capsys.readouterr().out


def test_several_images_one_line_each_and_the_worst_exit_code(monkeypatch, capsys) -> None:
    refs = [f"reg.local/fa:{tag}" for tag in ("pass", "wrong", "fail")]
    engine = Node(dict(zip(refs, (0, 8, 1))))
    assert check(monkeypatch, engine, *refs) == 1  # a failure is worst
    assert [line.split(" · ")[0] for line in capsys.readouterr().out.splitlines()] == [
        "reg.local/fa:pass: PASS",
        "reg.local/fa:wrong: WRONG ARCH",
        "reg.local/fa:fail: FAIL",
    ]
    assert check(monkeypatch, Node(dict(zip(refs[:2], (0, 8)))), *refs[:2]) == 8  # then wrong arch


def test_the_json_shape_and_the_report(monkeypatch, capsys, tmp_path: Path) -> None:
    engine = Node({IMAGE: 8})
    assert check(monkeypatch, engine, IMAGE, "--json", "--report", str(tmp_path / "check.json")) == 8
    data = json.loads(capsys.readouterr().out)  # stdout is the JSON alone
    assert data == json.loads((tmp_path / "check.json").read_text())
    assert data["engine"] == "fake engine" and data["exit_code"] == 8 and data["ok"] is False
    assert data["error"] is None
    (image,) = data["images"]
    runs_on = image["runs_on"]  # the compat table's GPUs of compute capability 8.x: where to check it
    assert {"A100 (AWS p4d, p4de)", "A10G (AWS g5)", "L4 (AWS g6)", "A30"} <= set(runs_on)
    assert not {"H100", "B200", "T4"} & {gpu.split()[0] for gpu in runs_on}
    assert image == {
        "image": IMAGE,
        "verdict": "wrong arch",
        "exit_code": 8,
        "detail": "WRONG ARCH: this GPU is sm_90; the extension carries sm_80; GPUs that run it: " + ", ".join(runs_on),
        "gpus": "runtime",
        "gpu": "NVIDIA H100 80GB HBM3",
        "arch": "sm_90",
        "image_id": f"sha256:id-of-{IMAGE}",
        "labels": {
            "flash_attn": "2.8.3",
            "torch": "2.9.1",
            "cuda": "12.8",
            "python": "3.12",
            "archs": "80",
            "entry": "fa2.8.3-py3.12-torch2.9.1-cu128",
        },
        "runs_on": runs_on,
        "seconds": image["seconds"],
        "comparisons": None,  # a wrong arch ran none
        "verdicts": [],  # no --verify
    }


def test_a_missing_image_is_pulled_first_and_never_pull_names_every_missing_one(monkeypatch, capsys) -> None:
    refs = ["reg.local/fa:a", "reg.local/fa:b"]
    engine = Node(dict.fromkeys(refs, 0), missing=frozenset(refs))
    assert check(monkeypatch, engine, *refs, "--pull", "never") == node_check.CannotPull.exit_code == 11
    err = capsys.readouterr().err
    assert "error: 2 images not in the engine: reg.local/fa:a, reg.local/fa:b; --pull never forbids pulling" in err
    assert not [c for c in engine.calls if c[0] in ("pull", "run")]
    assert check(monkeypatch, engine, *refs) == 0
    assert [c[0] for c in engine.calls if c[0] in ("pull", "run")] == ["pull", "pull", "run", "run"]


def test_a_failed_pull_is_one_error_before_any_check(monkeypatch, capsys) -> None:
    engine = Node({IMAGE: 0}, missing=frozenset({IMAGE}), unpullable=frozenset({IMAGE}))
    assert check(monkeypatch, engine, IMAGE) == 11  # not 3: a node without a GPU is another story
    err = capsys.readouterr().err
    assert f"error: cannot pull image {IMAGE}: pull of {IMAGE} failed: manifest unknown" in err
    assert "docker login ghcr.io" in err and "Traceback" not in err
    assert not [c for c in engine.calls if c[0] == "run"]


@pytest.mark.parametrize("ref", ["Reg.local/FA:x", "reg.local/fa:x;rm -rf /", "fa:\x1b[2Jx", "fa@sha256:zz", "a" * 300])
def test_a_bad_ref_is_refused_before_the_engine_is_asked(monkeypatch, capsys, ref: str) -> None:
    engine = Node({})
    assert check(monkeypatch, engine, "reg.local/fa:ok", ref) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: not an image reference: ") and "\x1b" not in err and len(err) < 1000
    assert engine.calls == []


def test_labels_and_output_from_the_image_are_escaped_and_bounded(monkeypatch, capsys) -> None:
    engine = Node({IMAGE: 0})
    engine.labels[IMAGE]["fa-images.torch"] = "2.9.1\x1b]0;owned\x07" + "x" * 5000
    assert check(monkeypatch, engine, IMAGE) == 0
    line = capsys.readouterr().out
    assert "\x1b" not in line and "\x07" not in line and len(line) < 1000


def test_gpus_devices_without_nodes_exits_3_before_the_engine(monkeypatch, capsys, tmp_path: Path) -> None:
    monkeypatch.setattr(gpus, "DEV", tmp_path)
    engine = Node({IMAGE: 0})
    assert check(monkeypatch, engine, IMAGE, "--gpus", "devices") == 3
    assert "error: --gpus devices: no NVIDIA device nodes" in capsys.readouterr().err and engine.calls == []


def test_flags_that_need_an_image_are_refused_without_one(monkeypatch, capsys) -> None:
    assert check(monkeypatch, Node({}), "--json") == 2
    assert "--json and --report go with IMAGE" in capsys.readouterr().err
    assert check(monkeypatch, Node({}), IMAGE, "--import-only") == 2


def test_help_teaches_the_verdicts_and_exit_codes(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["check", "--help"])
    text = capsys.readouterr().out
    for said in ("0 pass", "1 fail", "3 no GPU", "8 wrong arch", "--pull", "--gpus", "worst"):
        assert said in text


def test_devices_passed_that_the_image_cannot_see_is_a_failure_not_no_gpu(monkeypatch, capsys) -> None:
    """As in `build`: --gpus devices found GPUs on the host, so a check that sees none is broken."""
    host = gpus.HostGpus(devices=("/dev/nvidia0", "/dev/nvidiactl"), libraries=("/lib/libcuda.so.1",))
    monkeypatch.setattr(check_command, "resolve_gpus", lambda mode: gpus.GpuAccess(mode, host))
    engine = Node({IMAGE: contract.EXIT_NO_GPU})
    assert check(monkeypatch, engine, IMAGE, "--gpus", "devices") == 1
    assert "FAIL" in capsys.readouterr().out and ("run", IMAGE, contract.GPU_CHECK_COMMAND, host) in engine.calls


def test_every_image_that_cannot_be_pulled_is_named_in_one_error(monkeypatch, capsys) -> None:
    """As `build` with its bases: each pull is tried, then one error names every failure."""
    other = "reg.local/fa:b"
    engine = Node({IMAGE: 0, other: 0}, missing=frozenset({IMAGE, other}), unpullable=frozenset({IMAGE, other}))
    assert check(monkeypatch, engine, IMAGE, other) == 11
    err = capsys.readouterr().err
    assert f"error: cannot pull 2 images ({IMAGE}, {other}): manifest unknown" in err, err
    assert "docker login ghcr.io" in err and "docker login reg.local" in err
    assert [c[0] for c in engine.calls if c[0] in ("pull", "run")] == ["pull", "pull"]


def test_the_report_is_written_when_a_pull_stops_the_check(monkeypatch, capsys, tmp_path: Path) -> None:
    """As `build --report`: the record of a run that ended early says how, with its exit code."""
    report = tmp_path / "check.json"
    report.write_text('{"ok": true}')  # an earlier run's success must not stand
    engine = Node({IMAGE: 0}, missing=frozenset({IMAGE}), unpullable=frozenset({IMAGE}))
    assert check(monkeypatch, engine, IMAGE, "--report", str(report)) == 11
    data = json.loads(report.read_text())
    assert data["ok"] is False and data["exit_code"] == 11 and data["images"] == []
    assert data["error"].startswith(f"cannot pull image {IMAGE}: ")


def test_json_prints_its_object_when_a_pull_stops_the_check(monkeypatch, capsys) -> None:
    engine = Node({IMAGE: 0}, missing=frozenset({IMAGE}), unpullable=frozenset({IMAGE}))
    assert check(monkeypatch, engine, IMAGE, "--json") == 11
    captured = capsys.readouterr()
    data = json.loads(captured.out)  # stdout is the JSON alone, on this exit too
    assert data["exit_code"] == 11 and data["ok"] is False and data["images"] == []
    assert data["error"].startswith(f"cannot pull image {IMAGE}: ")
    assert f"\nerror: cannot pull image {IMAGE}: " in captured.err


def test_an_image_fa_images_did_not_build_is_said_so_with_a_code_of_its_own(monkeypatch, capsys) -> None:
    other = "docker.io/library/python:3.12"
    engine = Node({IMAGE: 8, other: 0})
    engine.labels[other] = {}
    assert check(monkeypatch, engine, other) == node_check.EXIT_NOT_FA_IMAGES == 12
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"{other}: NOT FA-IMAGES · no GPU seen · no fa-images labels · NOT FA-IMAGES: no ")
    assert not [c for c in engine.calls if c[0] == "run"]  # no check of its own to run
    assert check(monkeypatch, engine, IMAGE, other, "--json") == 12  # worse than wrong arch
    verdicts = [i["verdict"] for i in json.loads(capsys.readouterr().out)["images"]]
    assert verdicts == ["wrong arch", "not fa-images"]


def test_each_verdict_has_an_exit_code_of_its_own() -> None:
    codes = [*node_check.EXIT_CODES.values(), node_check.CannotPull.exit_code]
    assert len(set(codes)) == len(codes) == 6
