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

from fa_images.builder import fa4, untrusted
from fa_images.builder.errors import UsageError
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
