"""The typed plan and `fa-images build --dry-run [--json]`: what it says is what the executor does.

The dry-run tests run the real command line, on the repository's matrix.yaml (a subprocess, as a
user runs it) and on the tiny matrix (through ``cli.main``). The executor tests compare the plan
with the calls a fake engine receives; the real engine runs the same plan in test_build_engine.py.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
import subprocess
from pathlib import Path

import fakes
import pytest
from fakes import FakeEngine, accept_every_wheel

from fa_images import cli
from fa_images.builder import contract
from fa_images.config import matrix
from fa_images.outputs import render
from fa_images.run import executor, plan
from fa_images.run.executor import Options
from fa_images.run.logger import Console
from fa_images.run.report import write_report

REPO = Path(__file__).resolve().parents[2]
IMPORT_CHECK = ["python", "-m", "fa_images.builder", "check", "--import-only"]
GPU_CHECK = ["python", "-m", "fa_images.builder", "check"]


@pytest.mark.parametrize(
    ("check", "push", "steps", "checks"),
    [
        (True, False, ["source", "build", "export", "check", "gpu-check"], ["check", "gpu-check"]),
        (True, True, ["source", "build", "export", "check", "gpu-check", "push"], ["check", "gpu-check"]),
        (False, False, ["source", "build", "export"], []),
        (False, True, ["source", "build", "export", "push"], []),
    ],
    ids=["default", "push", "no-check", "no-check-push"],
)
def test_make_plan_steps_checks_and_pushes(tiny_matrix, check, push, steps, checks) -> None:
    plans = plan.make_plan(tiny_matrix.entries, form="buildkit", compiler_cache=True, check=check, push=push)
    assert [p.entry for p in plans] == list(tiny_matrix.entries)
    for p in plans:
        assert list(p.steps) == steps
        assert [c.step for c in p.checks] == checks
        # BuildKit's builder image carries the compile's build cache inline: pushed beside the image.
        assert p.push == ((p.entry.image, p.entry.builder_image) if push else ())


def test_one_build_makes_every_stage_and_the_rest_is_taken_from_its_stages(tiny_matrix) -> None:
    (p, _) = plan.make_plan(tiny_matrix.entries, form="sdk", compiler_cache=True, python_from=tiny_matrix.bases.python)
    assert (p.build.stage, p.build.tag) == ("runtime", p.entry.image)
    assert [(t.stage, t.tag) for t in p.from_stages] == [
        ("builder", p.entry.image + "-builder"),
        ("wheel", None),
        ("compiler-cache", None),
    ]
    assert p.tags == (p.entry.image, p.entry.image + "-builder")
    # Every stage named is a stage of the rendered Dockerfile, in its order (uv makes the Python
    # on the devel base first), and the runtime image is the last: one build makes them all.
    rendered = re.findall(r"^FROM \S+ AS (\S+)$", render.render_entry(tiny_matrix, p.entry, builder="sdk"), flags=re.M)
    assert rendered == ["uv-python", *p.stages]
    assert list(p.stages) == [
        contract.PYTHON_STAGE,
        contract.TORCH_STAGE,
        contract.BUILDER_STAGE,
        contract.WHEEL_STAGE,
        contract.CACHE_STAGE,
        contract.INSTALL_STAGE,
        contract.RUNTIME_STAGE,
    ]
    assert rendered[-1] == p.build.stage and {t.stage for t in p.from_stages} <= set(rendered)
    assert p.bases == (p.entry.devel_image, p.entry.runtime_image)


def test_buildkit_plans_the_cache_in_and_out_anew_and_pushes_the_builder_with_its_cache(tiny_matrix) -> None:
    (p, _) = plan.make_plan(
        tiny_matrix.entries, push=True, python_from=tiny_matrix.bases.python, form="buildkit", compiler_cache=True
    )
    image, builder = p.entry.image, p.entry.image + "-builder"
    # The torch stage first, from the cache, and committed by a step on it before the compile mounts
    # (and so hashes) its venv; that build's target is one empty file, not an image of torch.
    assert [(t.stage, t.anew) for t in p.before] == [
        (contract.TORCH_COMMIT_STAGE, False),
        (contract.CACHE_IN_STAGE, True),
    ]
    assert [(t.stage, t.tag, t.anew) for t in p.from_stages] == [
        ("builder", builder, False),
        ("wheel", None, False),
        ("compiler-cache", None, True),
    ]
    assert p.push == p.cache_from == (image, builder)
    rendered = re.findall(
        r"^FROM \S+ AS (\S+)$", render.render_entry(tiny_matrix, p.entry, builder="buildkit"), flags=re.M
    )
    assert rendered == ["uv-python", *p.stages] and rendered[-1] == p.build.stage
    assert {t.stage for t in (*p.before, *p.from_stages)} <= set(rendered)
    text = "\n".join(p.describe())
    assert f"  before     --target {contract.TORCH_COMMIT_STAGE} " in text and f"  push       {builder}" in text
    assert re.search(
        rf"  before     --target {contract.CACHE_IN_STAGE} .* \(built anew; best effort\)$", text, flags=re.M
    )
    assert f"  cache      from {image}, {builder}" in text
    # The legacy builder: its builder image holds a copy of torch and no build cache, and is not pushed.
    (legacy, _) = plan.make_plan(
        tiny_matrix.entries, push=True, python_from=tiny_matrix.bases.python, form="sdk", compiler_cache=True
    )
    assert (legacy.before, legacy.push, legacy.cache_from) == ((), (image,), ())
    # One base: the compile runs on the torch stage itself, which nothing mounts.
    one = dataclasses.replace(p.entry, devel_image=p.entry.runtime_image)
    (same,) = plan.make_plan([one], python_from=tiny_matrix.bases.python, form="buildkit", compiler_cache=True)
    assert [t.stage for t in same.before] == [contract.CACHE_IN_STAGE]
    rendered = re.findall(r"^FROM \S+ AS (\S+)$", render.render_entry(tiny_matrix, one, builder="buildkit"), flags=re.M)
    assert rendered == ["uv-python", *same.stages] and contract.TORCH_COMMIT_STAGE not in rendered
    # Without a push there is no registry to take a build cache from.
    (local, _) = plan.make_plan(
        tiny_matrix.entries, python_from=tiny_matrix.bases.python, form="buildkit", compiler_cache=True
    )
    assert local.push == local.cache_from == ()
    # Where the host keeps no compiler cache, neither its way in nor its way out is planned.
    (none, _) = plan.make_plan(
        tiny_matrix.entries, python_from=tiny_matrix.bases.python, form="buildkit", compiler_cache=False
    )
    assert [t.stage for t in none.before] == [contract.TORCH_COMMIT_STAGE]
    assert [t.stage for t in none.from_stages] == ["builder", "wheel"] and none.best_effort == frozenset()
    text = "\n".join(none.describe())
    assert contract.CACHE_IN_STAGE not in text and "compiler-cache " not in text


def test_a_prebuilt_wheel_plans_no_compile(tiny_matrix, tmp_path) -> None:
    wheel = tmp_path / "flash_attn-2.8.3+cu128torch2.9cxx11abitrue-cp311-cp311-linux_x86_64.whl"
    first, second = plan.make_plan(
        tiny_matrix.entries,
        form="sdk",
        compiler_cache=True,
        prebuilt={tiny_matrix.entries[0].id: wheel},
        python_from=tiny_matrix.bases.python,
    )
    assert first.prebuilt == wheel and second.prebuilt is None
    assert [(t.stage, t.tag) for t in first.from_stages] == [("wheel", None)]
    assert first.tags == (first.entry.image,)
    rendered = re.findall(
        r"^FROM \S+ AS (\S+)$", render.render_entry(tiny_matrix, first.entry, prebuilt=True, builder="sdk"), flags=re.M
    )
    assert rendered == ["uv-python", *first.stages] and "builder" not in rendered
    assert f"  wheel      {wheel}  (made around it: no compile)" in first.describe()
    # The devel base still makes uv's Python; with the system Python only the runtime base is used.
    assert first.bases == (first.entry.devel_image, first.entry.runtime_image)
    (system,) = plan.make_plan(
        tiny_matrix.entries[:1],
        form="buildkit",
        compiler_cache=True,
        prebuilt={first.entry.id: wheel},
        python_from="system",
    )
    assert system.before == () and system.push == ()  # made around a wheel: no compile, nothing built first
    assert system.bases == (system.entry.runtime_image,)


def test_check_commands_are_what_the_image_runs(tiny_matrix) -> None:
    (p, _) = plan.make_plan(tiny_matrix.entries, form="sdk", compiler_cache=True)
    text = render.render_entry(tiny_matrix, p.entry, builder="sdk")
    check, gpu_check = p.check("check"), p.check("gpu-check")
    assert check is not None and gpu_check is not None
    assert (list(check.command), check.gpus, check.no_gpu_exit) == (IMPORT_CHECK, None, None)
    assert (list(gpu_check.command), gpu_check.gpus, gpu_check.no_gpu_exit) == (GPU_CHECK, "runtime", 3)
    assert gpu_check.no_gpu_exit == contract.EXIT_NO_GPU  # the builder's `check` exits with it
    # The image's CMD and its build-time check are the plan's import check.
    assert f"\nCMD {json.dumps(IMPORT_CHECK)}\n" in text
    assert f"\n && {' '.join(IMPORT_CHECK)}\n" in text


@pytest.mark.parametrize(
    ("gpus", "gpu_check"),
    [
        ("runtime", (GPU_CHECK, "runtime", 3)),  # exit 3 (no GPU in the container) is a skip
        ("devices", (GPU_CHECK, "devices", None)),  # devices passed in but unseen: a failure
        ("none", None),  # the step stays, reported as skipped; it runs nothing
    ],
)
def test_the_gpu_check_follows_the_gpus_flag(tiny_matrix, gpus, gpu_check) -> None:
    (p, _) = plan.make_plan(tiny_matrix.entries, form="buildkit", compiler_cache=True, gpus=gpus)
    assert "gpu-check" in p.steps
    found = p.check("gpu-check")
    assert (found and (list(found.command), found.gpus, found.no_gpu_exit)) == gpu_check
    assert ("  gpu-check  skipped: --gpus none" in p.describe()) == (gpus == "none")


def test_every_step_has_one_method() -> None:
    assert list(plan.STEPS) == ["source", "build", "export", "check", "gpu-check", "push", "attest"]
    assert list(executor.STEP_TABLE) == list(plan.STEPS)
    assert len(set(executor.STEP_TABLE.values())) == len(plan.STEPS)


@pytest.mark.parametrize(
    ("push", "gpu", "gpu_exit", "gpu_check"),
    [
        (True, True, 0, "passed"),
        (False, True, 3, "skipped: no GPU visible in the container"),
        (
            False,
            False,
            0,
            "skipped: the engine has no GPU runtime (NVIDIA Container Toolkit); --gpus devices needs none",
        ),
    ],
    ids=["gpu-push", "no-gpu-in-container", "no-gpu-runtime"],
)
def test_the_executor_does_what_the_plan_says(tiny_matrix, tmp_path, monkeypatch, push, gpu, gpu_exit, gpu_check):
    accept_every_wheel(monkeypatch)
    engine = FakeEngine(gpu=gpu, gpu_exit=gpu_exit)
    options = Options(dist=tmp_path / "dist", log_dir=tmp_path / "logs")
    plans, results = fakes.execute(
        tiny_matrix, engine, options, Console(io.StringIO()), entries=tiny_matrix.entries[:1], push=push
    )
    ((p, r),) = zip(plans, results)
    assert [(c[1], c[2]) for c in engine.calls if c[0] == "build"] == [(p.build.stage, p.build.tag)]
    assert [c[1:] for c in engine.calls if c[0] == "tag"] == [
        (f"sha256:{p.entry.id}-{t.stage}", t.tag) for t in p.from_stages if t.tag
    ]
    ran = [c.command for c in p.checks if not c.gpus or gpu]  # without a GPU runtime the GPU check is skipped
    assert [(c[1], c[2]) for c in engine.calls if c[0] == "run"] == [(p.entry.image, command) for command in ran]
    assert [c[1] for c in engine.calls if c[0] == "push"] == list(p.push)
    assert (r.status, r.check, r.gpu_check, list(r.seconds)) == ("ok", "passed", gpu_check, list(p.steps))


def test_report_keeps_its_fields(tiny_matrix, tmp_path, monkeypatch) -> None:
    """report.json is read by pipelines: the fields they read stay, with the same values."""
    accept_every_wheel(monkeypatch)
    options = Options(dist=tmp_path / "dist", log_dir=tmp_path / "logs")
    engine = FakeEngine(fail_build={"py3.11"})
    plans, results = fakes.execute(tiny_matrix, engine, options, Console(io.StringIO()))
    write_report(tmp_path / "report.json", results, "fake engine")
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["engine"], report["ok"]) == ("fake engine", False)
    failed, ok = report["entries"]
    keys = {"id", "image", "status", "failed_step", "error", "image_id", "wheel", "wheel_sha256", "check"}
    keys |= {"gpu_check", "pushed", "kept_container", "log", "seconds"}
    assert keys <= set(failed) and keys <= set(ok)
    assert (failed["status"], failed["failed_step"], failed["check"], failed["gpu_check"]) == (
        "failed",
        "build",
        "not run",
        "not run",
    )
    assert (ok["status"], ok["failed_step"], ok["check"]) == ("ok", None, "passed")
    assert ok["gpu_check"].startswith("skipped: ") and set(ok["seconds"]) == set(plans[1].steps)


def entries_of(plan_json: list[dict], matrix_entries: list[dict]) -> None:
    """What every entry of a `--dry-run --json` must say, checked against `plan --json`."""
    assert [p["id"] for p in plan_json] == [e["id"] for e in matrix_entries]
    for p, e in zip(plan_json, matrix_entries):
        assert {k: p[k] for k in e} == e  # the entry's own facts, as `plan --json` prints them
        # The default builder here (the unit tier's docker CLI has buildx): BuildKit, two bases.
        assert p["builder"] == "buildkit" and p["stages"] == list(plan.BUILDKIT_TWO_BASE_STAGES)
        assert (p["build"]["stage"], p["build"]["tag"]) == ("runtime", e["image"])
        assert [(t["stage"], t["tag"]) for t in p["from_stages"]] == [
            ("builder", e["image"] + "-builder"),
            ("wheel", None),
            ("compiler-cache", None),
        ]
        assert p["prebuilt"] is None and p["bases"] == [e["devel_image"], e["runtime_image"]]
        assert p["tags"] == [e["image"], e["image"] + "-builder"]
        assert [(t["stage"], t["anew"], t["best_effort"]) for t in p["before"]] == [
            ("torch-commit", False, False),
            ("compiler-cache-in", True, True),
        ]


@pytest.mark.parametrize(
    ("flags", "steps", "checks", "pushed"),
    [
        ([], ["source", "build", "export", "check", "gpu-check"], [IMPORT_CHECK, GPU_CHECK], False),
        (["--push"], ["source", "build", "export", "check", "gpu-check", "push"], [IMPORT_CHECK, GPU_CHECK], True),
        (["--no-check", "--push"], ["source", "build", "export", "push"], [], True),
    ],
    ids=["default", "push", "no-check"],
)
def test_dry_run_json_of_the_repository_matrix(flags, steps, checks, pushed, run_fa_images) -> None:
    def fa_images(*args: str) -> subprocess.CompletedProcess[str]:
        return run_fa_images(args, cwd=REPO)

    dry = fa_images("build", "--dry-run", "--json", *flags)
    assert dry.returncode == 0 and dry.stderr == "", dry.stderr
    listed = fa_images("plan", "--json")
    assert listed.returncode == 0, listed.stderr
    plans, entries = json.loads(dry.stdout), json.loads(listed.stdout)
    assert len(plans) == len(matrix.load(REPO / "matrix.yaml").entries) == 4
    entries_of(plans, entries)
    for p in plans:
        assert p["steps"] == steps
        assert [c["command"] for c in p["checks"]] == checks
        assert p["push"] == ([p["image"], p["image"] + "-builder"] if pushed else [])


def test_dry_run_json_of_the_tiny_matrix(tiny_matrix, capsys) -> None:
    only = tiny_matrix.entries[1].id
    assert cli.main(["plan", "--json"]) == 0
    entries = json.loads(capsys.readouterr().out)
    assert cli.main(["build", "--dry-run", "--json", "--only", only]) == 0
    out = capsys.readouterr()
    plans = json.loads(out.out)
    entries_of(plans, [e for e in entries if e["id"] == only])
    assert plans[0]["image"] == f"reg.local/fa:{only}"
    assert [(c["step"], c["command"], c["gpus"], c["no_gpu_exit"]) for c in plans[0]["checks"]] == [
        ("check", IMPORT_CHECK, None, None),
        ("gpu-check", GPU_CHECK, "runtime", 3),
    ]
    assert cli.main(["build", "--dry-run", "--json", "--only", only, "--gpus", "none"]) == 0
    assert [c["step"] for c in json.loads(capsys.readouterr().out)[0]["checks"]] == ["check"]
    assert not Path("dist").exists() and not Path("logs").exists()  # a dry run builds nothing


def test_dry_run_text_names_targets_tags_and_commands(tiny_matrix, capsys) -> None:
    assert cli.main(["build", "--dry-run", "--push"]) == 0
    out = capsys.readouterr().out
    for e in tiny_matrix.entries:
        block = out[out.index(f"{e.id}: ") :].split("\n\n")[0]
        assert f"{e.id}: source -> build -> export -> check -> gpu-check -> push" in block
        assert re.search(r"^  before     --target torch-commit +the torch stage, committed", block, re.M)
        assert re.search(r"^  before     --target compiler-cache-in +the host's compiler cache", block, re.M)
        assert re.search(
            rf"^  build      --target runtime +{re.escape(e.image)}  \(every stage, in one build\)$", block, re.M
        )
        assert re.search(rf"^  stage      builder +tagged {re.escape(e.image)}-builder$", block, re.M)
        assert re.search(r"^  stage      wheel +the wheel, exported and verified into dist$", block, re.M)
        assert re.search(r"^  stage      compiler-cache +the compiler cache, kept on the host", block, re.M)
        assert f"  check      {' '.join(IMPORT_CHECK)}\n" in block
        assert f"  gpu-check  {' '.join(GPU_CHECK)}  (GPUs from the engine's NVIDIA runtime;" in block
        assert f"  push       {e.image}\n" in block


def test_json_without_dry_run_is_a_usage_error(tiny_matrix, capsys) -> None:
    assert cli.main(["build", "--json"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == ["error: --json goes with --dry-run"]


def test_the_readme_dry_run_is_the_real_output(run_fa_images) -> None:
    """The README shows `build --dry-run` on the repository's matrix: it must be what the command prints."""
    readme = (REPO / "README.md").read_text()
    found = re.search(r"^\$ fa-images (build --dry-run [^#\n]*?)[ \t]*(?:#[^\n]*)?\n(.*?)\n\n", readme, re.M | re.S)
    assert found, "the README shows a dry run"
    args, shown = found.group(1).split(), found.group(2)
    proc = run_fa_images(args, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip("\n") == shown


def test_plan_refuses_archs_that_miss_the_target(tmp_path, monkeypatch, capsys) -> None:
    """Issue 30: `archs: [80]` with `target: [H100]` planned archs 80 and no GPU; now exit 2 with the fix."""
    (tmp_path / "matrix.yaml").write_text(
        'matrix:\n  python: ["3.12"]\n  torch: ["2.9.1"]\n  flash_attn: ["2.8.3"]\n  archs: [80]\n  target: [H100]\n'
    )
    monkeypatch.chdir(tmp_path)
    assert cli.main(["plan", "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        "error: matrix.yaml:5: entry matrix[python=3.12, torch=2.9.1, flash_attn=2.8.3, archs=80, target=H100]: "
        "archs [80] do not cover target H100 (sm_90) (add 90 to archs, or drop archs to take the target's)"
    ]
    (tmp_path / "matrix.yaml").write_text(
        'entries:\n  - {python: "3.12", torch: "2.9.1", flash_attn: "2.8.3", archs: [80, 90], target: [H100]}\n'
    )
    assert cli.main(["plan", "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)
    assert (entry["archs"], entry["gpus"]) == (["80", "90"], ["H100"])


RULED_MATRIX = """\
image: reg.local/fa
matrix:
  python: ["3.9", "3.12"]
  torch: ">=2.9,<2.10"
  cuda: ">=12.9,<13.1"
  flash_attn: ["2.8.3"]
  target: [A100]
"""
RULED_NOTES = [
    'matrix.torch ">=2.9,<2.10" resolves to 2.9.0, 2.9.1',
    'matrix.cuda ">=12.9,<13.1" resolves to 12.9, 13.0',
    *(
        f"left out matrix[python=3.9, torch={t}, cuda={c}, flash_attn=2.8.3, target=A100]: "
        f"torch {t} has no wheels for Python 3.9"
        for t in ("2.9.0", "2.9.1")
        for c in ("12.9", "13.0")
    ),
    *(
        f"left out matrix[python=3.12, torch={t}, cuda=12.9, flash_attn=2.8.3, target=A100]: "
        f"torch {t} has no CUDA 12.9 build"
        for t in ("2.9.0", "2.9.1")
    ),
    "left out matrix[python=3.12, torch=2.9.0, cuda=13.0, flash_attn=2.8.3, target=A100]: "
    "torch 2.9.1 is newer in the 2.9 series, and one wheel serves a series",
]


def test_plan_says_what_each_rule_resolved_to_and_what_it_left_out(tmp_path, monkeypatch, capsys) -> None:
    """Issue 29: the rules' versions and each left-out combination with its reason, before the entries."""
    (tmp_path / "matrix.yaml").write_text(RULED_MATRIX)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["plan"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[: len(RULED_NOTES)] == RULED_NOTES
    assert [line.split()[0] for line in lines[len(RULED_NOTES) : -1]] == ["fa2.8.3-py3.12-torch2.9.1-cu130"]
    assert lines[-1] == "1 entry in 1 compile group (entries that share kernels); 7 combinations left out"
    assert err == ""
    # --json: stdout stays the entries alone, the notes go to stderr.
    assert cli.main(["plan", "--json"]) == 0
    out, err = capsys.readouterr()
    assert [e["id"] for e in json.loads(out)] == ["fa2.8.3-py3.12-torch2.9.1-cu130"]
    assert err.splitlines() == RULED_NOTES


def test_a_matrix_without_rules_plans_as_before(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "matrix.yaml").write_text(
        'matrix:\n  python: ["3.12"]\n  torch: ["2.9.1"]\n  flash_attn: ["2.8.3"]\n  target: [A100]\n'
    )
    monkeypatch.chdir(tmp_path)
    assert cli.main(["plan"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == "1 entry in 1 compile group (entries that share kernels)"
    assert len(out.splitlines()) == 2 and err == ""
