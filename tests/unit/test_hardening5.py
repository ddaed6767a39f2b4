"""Hardening round 5, by class: credentials in query strings, sizes that grew without a bound
(duplicate GPUs, an FA4 grid), and `--json` on every exit of `check`. The install record's
classes are in test_this_install.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fa_images.builder import untrusted
from fa_images.builder.errors import UsageError
from fa_images.builder.generations import fa4
from fa_images.config import matrix as matrix_mod

REPO = Path(__file__).resolve().parents[2]


def fa_images(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    """This checkout's fa-images, wherever it runs (not an installed one)."""
    import os

    full = {**(env or os.environ), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "fa_images", *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=full
    )


# --- credentials in query strings and logins, wherever a line is printed -------------------------


@pytest.mark.parametrize(
    "text",
    [
        "https://host/simple?token=SECRETX",
        "https://gitlab.example/api/v4/projects/1/packages/pypi/simple?private_token=SECRETX&x=1",
        "https://bucket.s3.amazonaws.com/w.whl?X-Amz-Credential=SECRETX&X-Amz-Signature=SECRETX",
        "https://acct.blob.core.windows.net/c/w.whl?sv=2024&sig=SECRETX",
        "flash-attn @ https://user:SECRETX@host/flash_attn.whl",
        "pip install git+https://SECRETX@github.com/acme/fa-images@abc",
    ],
)
def test_every_credential_a_url_carries_is_masked_in_what_is_printed(text: str) -> None:
    assert "SECRETX" not in untrusted.shown(text)
    assert "SECRETX" not in untrusted.shown_url(text.split(" ")[-1])


@pytest.mark.parametrize("text", ["git+ssh://git@github.com/acme/repo", "https://host/simple?page=2", "a=b"])
def test_what_carries_no_credential_is_printed_as_it_is(text: str) -> None:
    assert untrusted.shown(text) == text


def test_a_compat_pin_with_a_login_never_reaches_the_console(tmp_path: Path) -> None:
    (tmp_path / "extra.yaml").write_text('runtime_deps: ["einops @ https://user:SECRETX@host/einops.whl extra"]\n')
    (tmp_path / "matrix.yaml").write_text(
        'compat: extra.yaml\nentries: [{python: "3.12", torch: "2.9.1", flash_attn: "2.8.3", archs: [80]}]\n'
    )
    proc = fa_images("plan", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "SECRETX" not in proc.stdout + proc.stderr and "***" in proc.stderr


# --- sizes: a GPU named twice, an FA4 grid ------------------------------------------------------


def test_a_gpu_named_many_times_is_one_gpu(tmp_path: Path) -> None:
    target = ["A100", "a100", "A10G", "a-100"] * 2500
    (tmp_path / "matrix.yaml").write_text(
        yaml.safe_dump({"entries": [{"python": "3.12", "torch": "2.9.1", "flash_attn": "2.8.3", "target": target}]})
    )
    (entry,) = matrix_mod.load(tmp_path / "matrix.yaml").entries
    assert entry.gpus == ("A100", "A10G")
    proc = fa_images("plan", cwd=tmp_path)
    assert "for A100, A10G\n" in proc.stdout


def test_an_fa4_grid_keeps_each_value_once_and_is_bounded() -> None:
    grid = fa4.Fa4Grid(head_dims=(64,) * 500, kv_heads=(16, 4, 16), modes=("infer", "infer"))
    assert (grid.head_dims, grid.kv_heads, grid.modes) == ((64,), (16, 4), ("infer",))
    assert len(grid.points()) == 4
    with pytest.raises(UsageError, match=r"FA4 grid: 640 calls; at most 256"):
        fa4.Fa4Grid(head_dims=tuple(range(8, 257, 8)), kv_heads=(1, 2, 4, 8, 16))


def test_a_grid_of_a_million_calls_is_refused_by_the_builder_before_fa4_is_imported(tmp_path: Path) -> None:
    dims = ",".join(str(d) for d in range(8, 257, 8))
    proc = subprocess.run(
        [sys.executable, "-m", "fa_images.builder", "fa4-cache", "--out", str(tmp_path / "c"), "--target",
         "H100:9.0:132", "--head-dims", dims, "--kv-heads", "1,2,4,8,16", "--dtypes", "bf16,fp16"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and "at most 256" in proc.stderr
    assert not (tmp_path / "c").exists()


# --- check --json: an object on every exit -----------------------------------------------------


@pytest.mark.parametrize(
    "args, env, code, says",
    [
        (["NOT A REF!"], {}, 2, "not an image reference"),
        (["alpine:3", "--import-only"], {}, 2, "--import-only goes without IMAGE"),
        (["alpine:3"], {"DOCKER_HOST": "unix:///nonexistent/fa-images.sock"}, 7, "no Docker Engine answers"),
    ],
)
def test_check_json_prints_its_object_on_every_exit(tmp_path: Path, args, env, code: int, says: str) -> None:
    import os

    report = tmp_path / "r.json"
    proc = fa_images("check", *args, "--json", "--report", str(report), env={**os.environ, **env})
    assert proc.returncode == code, proc.stderr
    data = json.loads(proc.stdout)
    assert data["exit_code"] == code and data["ok"] is False and says in data["error"]
    assert json.loads(report.read_text()) == data
    assert proc.stderr.startswith("error: ")


# --- a mixed matrix in every export: every problem in one run, nothing written -----------------

MIXED = """\
entries:
  - {python: "3.12", torch: "2.9.1", cuda: "12.8", flash_attn: "3.0.0", target: [H100]}
  - {python: "3.12", torch: "2.11.0", flash_attn: "4.0.0b36", target: [H100]}
  - {python: "3.12", torch: "2.11.0", flash_attn: "3.0.0", target: [H100]}
"""


def test_bake_names_every_entry_without_a_source_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "matrix.yaml").write_text(MIXED)
    proc = fa_images("export", "bake", "--out-dir", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 4, proc.stderr
    [line] = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert line.startswith("error: 2 entries without a source: fa3.0.0-py3.12-torch2.9.1-cu128: ")
    assert "fa3.0.0-py3.12-torch2.11.0-cu130: " in line and "fa4" not in line  # FA4 has none to fetch
    assert not (tmp_path / "out").exists()


def test_bake_of_an_fa4_entry_fetches_nothing(tmp_path: Path) -> None:
    (tmp_path / "matrix.yaml").write_text(MIXED.splitlines()[0] + "\n" + MIXED.splitlines()[2] + "\n")
    proc = fa_images("export", "bake", "--out-dir", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "docker-bake.json").is_file()
    dry = fa_images("build", "--dry-run", cwd=tmp_path)
    assert (
        "  source     flash-attn-4==4.0.0b36 and its pinned set from the index, in the build (no sdist)" in dry.stdout
    )


def test_slurm_names_every_problem_of_a_mixed_matrix_in_one_run(tmp_path: Path) -> None:
    (tmp_path / "matrix.yaml").write_text(MIXED)
    proc = fa_images("export", "slurm", "--out-dir", str(tmp_path / "out"), "--shards", "2", cwd=tmp_path)
    assert proc.returncode == 2
    [line] = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert line.startswith("error: no batch script written, 3 problems: ")
    assert line.count("built unsharded") == 2 and line.count("makes no wheel for a node") == 1
    assert not (tmp_path / "out").exists()


def test_export_github_refuses_fa3_entries_whose_archive_a_job_cannot_find(tmp_path: Path) -> None:
    (tmp_path / "matrix.yaml").write_text(MIXED)
    out = tmp_path / "wf.yml"
    proc = fa_images("export", "github", "--install", "fa-images==1.0", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.startswith("error: 2 entries without a source archive: fa3.0.0-py3.12-torch2.9.1-cu128: ")
    assert "fa-images source fa3" in proc.stderr and not out.exists()


# --- the runner fit counts every generation's compile ---------------------------------------------


def _entries(tmp_path: Path, text: str):
    (tmp_path / "matrix.yaml").write_text(text)
    return matrix_mod.load(tmp_path / "matrix.yaml").entries


def test_two_full_fa3_jobs_run_out_of_time_where_a_trimmed_one_fits(tmp_path: Path) -> None:
    """Upstream's full FA3 build is 293 units (its setup.py at the pinned commit); each is counted."""
    from fa_images.outputs.exports import runner_fit

    fa3_only = "\n".join(MIXED.splitlines()[i] for i in (0, 1, 3)) + "\n"
    full = _entries(tmp_path, fa3_only)
    assert [len(e.recipe.build.sources()) for e in full] == [293, 293]
    with pytest.raises(UsageError) as refused:
        runner_fit.check(full, cpus=4, memory_gib=16, timeout=100, shards=4, sharding=True)
    assert "2 build jobs would run out of time (--timeout-minutes 100)" in str(refused.value)
    assert "compiles 293 FlashAttention-3 kernels, about 263 min with 3 nvcc jobs at once" in str(refused.value)
    assert "--shards" not in (refused.value.hint or "")  # FA3 is built unsharded: shards change nothing
    knobs = "fa3: {head_dims: [128], dtypes: [bf16], without: [split, paged_kv, softcap, packgqa, sm80, hdim_diff]}\n"
    trimmed = _entries(tmp_path, knobs + fa3_only)
    assert [len(e.recipe.build.sources()) for e in trimmed] == [4, 4]  # flash_api, fwd and bwd bf16, the scheduler
    runner_fit.check(trimmed, cpus=4, memory_gib=16, timeout=100, shards=1, sharding=True)


def test_an_fa4_cache_step_is_counted_for_each_gpu_it_compiles_for(tmp_path: Path) -> None:
    from fa_images.outputs.exports import runner_fit

    one, five = _entries(
        tmp_path,
        "entries:\n"
        '  - {python: "3.12", torch: "2.11.0", flash_attn: "4.0.0b36", target: [H100]}\n'
        '  - {python: "3.12", torch: "2.11.0", flash_attn: "4.0.0b36",\n'
        '     target: [H100, H200, B200, "RTX PRO 6000", L40S]}\n'
        "fa4: {head_dims: [64, 96, 128, 192, 256], dtypes: [bf16, fp16], kv_heads: [16, 8, 4, 2, 1]}\n",
    )
    assert runner_fit.work(five).serial_seconds == 5 * runner_fit.work(one).serial_seconds > 0
    assert runner_fit.fit(five, cpus=4, memory_gib=16).minutes > runner_fit.fit(one, cpus=4, memory_gib=16).minutes
    with pytest.raises(UsageError, match=r"compiles FA4's 1000 calls ahead \(5 GPUs\), one at a time"):
        runner_fit.check((one, five), cpus=4, memory_gib=16, timeout=60, shards=1, sharding=True)


def test_plan_and_render_warn_of_an_fa3_archive_a_build_would_not_find(tmp_path: Path) -> None:
    (tmp_path / "matrix.yaml").write_text(MIXED)
    for args in (("plan",), ("plan", "--json"), ("render", "--out", "df")):
        proc = fa_images(*args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        [warning] = [x for x in proc.stderr.splitlines() if x.startswith("warning:")]
        assert warning.startswith("warning: 2 entries without a source archive, which build and the exports refuse: ")
        assert "fa3.0.0-py3.12-torch2.9.1-cu128: no flash_attn_3-3.0.0.tar.gz (packages.sdists is not set)" in warning
    (tmp_path / "sdists").mkdir()
    (tmp_path / "matrix.yaml").write_text("packages: {sdists: sdists}\n" + MIXED)
    assert "no flash_attn_3-3.0.0.tar.gz in " in fa_images("plan", cwd=tmp_path).stderr
    (tmp_path / "sdists" / "flash_attn_3-3.0.0.tar.gz").write_bytes(b"")  # its pin is checked where it is read
    assert "warning" not in fa_images("plan", cwd=tmp_path).stderr
