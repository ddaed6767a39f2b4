"""FlashAttention-4: its grid, the matrix's FA4 entries and their Dockerfile (no compile with nvcc,
no wheel, its kernels compiled in the install stage with no GPU), the plan and the executor
around them, and the GPU check's verdict on the first calls. The real compile and check ran on
an H100 (bench/gpu_container/fa4_native.sh): 31 kernels with no GPU, then 0 compiled at the
grid's first calls."""

from __future__ import annotations

import io
import re
from pathlib import Path

import fakes
import pytest

from fa_images.builder import contract, generations, gpucheck
from fa_images.builder.comparison import CaseResult
from fa_images.builder.errors import UsageError
from fa_images.builder.generations import fa4


def test_the_default_grid_covers_the_common_llm_calls() -> None:
    grid = fa4.Fa4Grid()
    points = grid.points()
    assert len(points) == 16 and {p.head_dim for p in points} == {64, 128}
    assert {p.kv_heads for p in points} == {16, 4} and {p.mode for p in points} == {"train", "infer"}
    assert fa4.Fa4Grid.from_json(grid.to_json()) == grid
    assert "GQA 16/4" in points[2].name() and grid.describe().endswith("train+infer")


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        (dict(head_dims=(100,)), "multiples of 8"),
        (dict(dtypes=("fp8",)), "dtypes ['fp8']"),
        (dict(kv_heads=(3,)), "must divide the 16 query heads"),
        (dict(modes=("serve",)), "modes ['serve']"),
        (dict(seqlen=0), "seqlen 1..131072"),
    ],
)
def test_a_grid_fa4_cannot_run_is_refused(kwargs, says: str) -> None:
    with pytest.raises(UsageError, match=says.replace("[", r"\[").replace("]", r"\]")):
        fa4.Fa4Grid(**kwargs)


def test_the_builder_refuses_a_bad_grid_before_importing_fa4(tmp_path: Path, capsys) -> None:
    from fa_images.builder.cli import main

    assert main(["fa4-cache", "--out", str(tmp_path), "--target", "H100:9.0:132", "--kv-heads", "5"]) == 2
    assert "must divide the 16 query heads" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_the_cache_is_fa4s_own_environment(tmp_path: Path, monkeypatch) -> None:
    for var in (fa4.CACHE_ENV, fa4.CACHE_ON_ENV, "FLASH_ATTENTION_ARCH", "CUTE_DSL_ARCH", "FLASH_ATTENTION_NUM_SMS"):
        monkeypatch.delenv(var, raising=False)
    assert fa4.configured_cache() is None
    fa4.use_cache(tmp_path, fa4.Fa4Target("B200", "10.0", 148))
    assert fa4.configured_cache() == tmp_path
    import os

    assert (os.environ["FLASH_ATTENTION_ARCH"], os.environ["CUTE_DSL_ARCH"]) == ("sm_100", "sm_100a")
    (tmp_path / "fp" / "fwd").mkdir(parents=True)
    (tmp_path / "fp" / "fwd" / "a.o").write_bytes(b"")
    (tmp_path / "fp" / "fwd" / "a.lock").write_bytes(b"")
    assert fa4.kernels_in(tmp_path) == 1


def test_the_check_fails_an_image_whose_declared_grid_compiled_at_its_first_calls(monkeypatch) -> None:
    import torch

    monkeypatch.setattr(gpucheck, "installed", lambda: [generations.FA4])
    monkeypatch.setattr(fa4, "import_check", lambda: "flash-attn-4 imports")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda _i=0: "NVIDIA Test GPU")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda _i=0: (9, 0))
    for compiles, code in ((0, 0), (3, 1)):
        said = f"{compiles} kernels compiled at the first calls, 0.10 s for the grid's 16 calls"
        first = CaseResult("first calls", compiles, 0, said=said)
        monkeypatch.setattr(fa4, "check_cases", lambda first=first: [CaseResult("forward", 0.0, 1.0), first])
        lines: list[str] = []
        assert gpucheck.run(out=lines.append) == code
        assert any(said in line for line in lines)


# --- the matrix, the Dockerfile, the plan and the executor -----------------------------------------


def load(tmp_path: Path, text: str):
    from fa_images.config import matrix

    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    return matrix.load(path)


ENTRY = 'entries: [{python: "3.12", torch: "2.11.0", flash_attn: "4.0.0b36", target: [H100, B200]}]\n'


def test_an_fa4_entry_carries_its_grid_for_each_gpu_of_its_target(tmp_path: Path) -> None:
    m = load(tmp_path, "fa4: {head_dims: [128], kv_heads: [16], causal: [true]}\n" + ENTRY)
    (entry,) = m.entries
    assert entry.generation is generations.FA4 and entry.gpus == ("H100", "B200") and entry.archs == ("90a", "100a")
    assert entry.recipe.grid == fa4.Fa4Grid(head_dims=(128,), kv_heads=(16,), causal=(True,))


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (ENTRY.replace("H100, B200", "B300"), "the compat table has no SM count for B300"),
        (ENTRY.replace("H100, B200", "T4"), "T4 (compute capability 7.5) cannot run FlashAttention-4"),
        (
            ENTRY.replace('"2.11.0"', '"2.9.1"'),
            "has no pinned set for CUDA 12 (the table has CUDA 13) "
            '(torch 2.9.1 has a CUDA 13.0 build: write cuda: "13.0")',
        ),
        (ENTRY.replace('"3.12"', '"3.9"'), "needs Python >= 3.10"),
        ("fa4: {modes: [train]}\n" + ENTRY.replace("H100, B200", "g5"), "A10G runs none of the grid's calls"),
        (ENTRY.replace("target: [H100, B200]", "archs: [90]"), "archs is not for FlashAttention-4"),
        ("fa4: {head_dims: [128], seqs: 1}\n" + ENTRY, "unknown key fa4.seqs"),
        ("fa4: {causal: [yes-please]}\n" + ENTRY, "fa4.causal must be a list of true or false"),
        (ENTRY.replace("4.0.0b36", "4.0.0b1"), "FlashAttention-4 4.0.0b1 is not in the compat table"),
    ],
)
def test_an_fa4_entry_it_cannot_build_is_refused_with_its_reason(text: str, says: str, tmp_path: Path) -> None:
    from fa_images.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text)
    assert says in str(caught.value)


def test_the_dockerfile_installs_fa4_pinned_and_compiles_its_grid_per_gpu(tmp_path: Path) -> None:
    from fa_images.config.generations.fa4 import CACHE
    from fa_images.outputs.render import render_entry
    from fa_images.outputs.wheelhouse import runtime_deps

    def fingerprint(m, entry) -> str:
        return entry.recipe.fingerprint(entry, runtime_deps(m, entry))

    m = load(tmp_path, ENTRY)
    (entry,) = m.entries
    for form in ("buildkit", "sdk"):
        text = render_entry(m, entry, builder=form)
        assert "AS builder" not in text and "AS wheel" not in text and "AS compiler-cache" not in text
        assert " flash-attn-4==4.0.0b36 " in text and " nvidia-cutlass-dsl-libs-cu13==4.8.1 " in text
        assert text.count("python -m fa_images.builder fa4-cache") == 2 and "--target B200:10.0:148" in text
        assert f"FLASH_ATTENTION_CUTE_DSL_CACHE_DIR={CACHE}" in text and 'fa-images.generation="4"' in text
        assert f'fa-images.fa4-cache="{fingerprint(m, entry)}"' in text
    other = load(tmp_path, "fa4: {head_dims: [64]}\n" + ENTRY)  # another grid: other kernels, another label
    assert fingerprint(other, other.entries[0]) != fingerprint(m, entry)


def test_the_plan_and_the_run_make_no_wheel(tmp_path: Path, monkeypatch) -> None:
    from fa_images.run.executor import Options
    from fa_images.run.logger import Console

    m = load(tmp_path, ENTRY)
    engine = fakes.FakeEngine()
    engine.nvcc = "13.0"
    options = Options(dist=tmp_path / "dist", log_dir=tmp_path / "logs")
    plans, results = fakes.execute(m, engine, options, Console(io.StringIO()), python_from=m.bases.python)
    (plan,) = plans
    assert contract.BUILDER_STAGE not in plan.stages and contract.WHEEL_STAGE not in plan.stages
    assert plan.from_stages == () and plan.before == ()
    (result,) = results
    assert result.status == "ok" and result.wheel is None and not (tmp_path / "dist" / "manifest.json").exists()


def test_a_batch_script_refuses_fa4_which_makes_no_wheel(tmp_path: Path) -> None:
    from fa_images.outputs.exports import slurm

    m = load(tmp_path, ENTRY)
    with pytest.raises(UsageError, match="FlashAttention-4 makes no wheel"):
        slurm.export(m, m.entries, tmp_path / "out", slurm.SlurmOptions())


def test_the_matrix_reads_every_field_of_a_generations_settings() -> None:
    from dataclasses import fields

    from fa_images.config import generations

    for section in generations.sections():
        assert set(section.fields) == {f.name for f in fields(section.settings)}, section.key
    assert [s.key for s in generations.sections()] == ["fa3", "fa4"]


# --- every GPU class FA4's code runs on: its facts from the compat table -------------------------


@pytest.mark.parametrize(
    "text, says",
    [
        ("H100", "is not NAME:CAPABILITY:SMS"),
        ("H100:9:132", "is not NAME:CAPABILITY:SMS"),
        ("H100:9.0:0", "the SM count must be 1 to 1024"),
        ("T4:7.5:40", "runs on compute capability 8.x to 12.x"),
        ("$(x):9.0:132", "is not NAME:CAPABILITY:SMS"),
    ],
)
def test_a_target_is_a_gpu_s_name_capability_and_sm_count(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        fa4.Fa4Target.parse(text)


def test_each_arch_class_compiles_what_fa4_runs_there() -> None:
    a10g, h100, pro6000 = (fa4.Fa4Target.parse(t) for t in ("A10G:8.6:80", "H100:9.0:132", "RTXPRO6000:12.0:188"))
    assert (a10g.arch, a10g.compile_target) == ("sm_86", "sm_86")
    assert (h100.arch, h100.compile_target) == ("sm_90", "sm_90a")
    assert pro6000.compile_target == "sm_120a"
    grid = fa4.Fa4Grid(head_dims=(128,), kv_heads=(16,), causal=(True,))
    assert {p.mode for p in grid.points(a10g.major)} == {"infer"}  # 8.x: FA4's backward refuses it
    assert len(grid.points(h100.major)) == len(grid.points()) == 2


def test_the_gpu_table_gives_fa4_each_gpu_s_sm_count(tmp_path: Path) -> None:
    from fa_images.config import compat as compat_mod
    from fa_images.config.generations.fa4 import target

    table = compat_mod.load()
    assert target(table, "g7e") != target(table, "RTX PRO 6000")  # a family is not a GPU name
    assert target(table, "RTX PRO 6000") == fa4.Fa4Target("RTXPRO6000", "12.0", 188)
    assert table.gpu("RTX PRO 6000") == compat_mod.Gpu("RTXPRO6000", "12.0", 188)
    b300 = table.gpu("B300")
    assert "no SM count for B300" in str(target(table, "B300")) and b300 is not None and b300.sms is None
    assert "runs on compute capability 8.x to 12.x" in str(target(table, "T4"))
    override = tmp_path / "more.yaml"
    override.write_text('gpus: {B300: {capability: "10.3", sms: 148}}\n')
    assert target(compat_mod.load(override), "B300") == fa4.Fa4Target("B300", "10.3", 148)


@pytest.mark.parametrize(
    "gpus, says",
    [
        ('{H100: {capability: "9.0", sms: 0}}', "sms 0 must be its SM count"),
        ('{H100: {capability: "9.0", sms: "132"}}', "must be its SM count"),
        ('{H100: {capability: "9.0", cores: 1}}', "only capability and sms"),
        ("{NEWGPU: {sms: 132}}", "its compute capability is missing"),
        ("{NEWGPU: {capability: 9.0}}", "must be a quoted string"),
    ],
)
def test_a_gpu_s_facts_are_checked(tmp_path: Path, gpus: str, says: str) -> None:
    from fa_images.config import compat as compat_mod
    from fa_images.errors import ConfigError

    override = tmp_path / "more.yaml"
    override.write_text(f"gpus: {gpus}\n")
    with pytest.raises(ConfigError, match=re.escape(says)):
        compat_mod.load(override)


def test_a_fleet_gets_an_fa4_image_per_class_with_its_targets_in_its_labels(tmp_path: Path) -> None:
    from fa_images.outputs.render import render_entry

    m = load(
        tmp_path,
        'matrix: {python: ["3.12"], torch: ["2.11.0"], flash_attn: ["4.0.0b36"], target: [[g5, g6e], p5, g7e]}\n',
    )
    by_class = {e.gpu_class: e for e in m.entries}
    assert sorted(by_class) == ["sm120a", "sm86.89", "sm90a"]
    assert by_class["sm86.89"].gpus == ("A10G", "L40S") and by_class["sm86.89"].archs == ("86", "89")
    text = render_entry(m, by_class["sm120a"], builder="buildkit")
    assert "--target RTXPRO6000:12.0:188" in text and 'fa-images.fa4-targets="RTXPRO6000:12.0:188"' in text


def test_the_check_of_an_fa4_image_on_a_gpu_it_was_not_compiled_for_is_wrong_arch(tmp_path: Path, monkeypatch) -> None:
    import json

    import torch

    (tmp_path / fa4.TARGETS_FILE).write_text(json.dumps(["RTXPRO6000:12.0:188"]))
    monkeypatch.setenv(fa4.CACHE_ON_ENV, "1")
    monkeypatch.setenv(fa4.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(gpucheck, "installed", lambda: [generations.FA4])
    monkeypatch.setattr(fa4, "import_check", lambda: "flash-attn-4 imports")
    monkeypatch.setattr(fa4, "check_cases", lambda: pytest.fail("no kernel runs on a GPU of another class"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda _i=0: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda _i=0: (9, 0))
    lines: list[str] = []
    assert gpucheck.run(out=lines.append) == contract.EXIT_WRONG_ARCH
    assert any(line.startswith("WRONG ARCH") and "sm_120a" in line for line in lines), lines
