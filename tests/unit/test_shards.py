"""``wheel --shard I/N``: parsing, the balanced split, and the final run's refusal of missing shards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.build_settings import make_settings

from fa_images.builder import shards
from fa_images.builder.errors import BuildFailed
from fa_images.builder.setup_shim import expected_seconds, longest_first

COSTS = json.loads((Path(shards.__file__).with_name("compile_costs.json")).read_text())


@pytest.mark.parametrize(("text", "expected"), [("1/1", (1, 1)), ("2/3", (2, 3)), (" 3/3 ", (3, 3))])
def test_a_shard_is_i_of_n(text: str, expected: tuple[int, int]) -> None:
    shard = shards.parse_shard(text)
    assert (shard.index, shard.count) == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("0/3", "is not I/N"),
        ("4/3", "does not exist"),
        ("1/0", "is not I/N"),
        ("-1/3", "is not I/N"),
        ("1/3/4", "is not I/N"),
        ("a/b", "is not I/N"),
        ("1/1001", "at most 1000"),
        ("1/99999", "is not I/N"),
        ("１/３", "is not I/N"),  # full-width digits: str.isdigit says yes, the grammar says no
        ("1 /3", "is not I/N"),
    ],
)
def test_a_bad_shard_is_refused(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        shards.parse_shard(text)


def test_the_cli_refuses_a_bad_shard_with_one_line(run_fa_images, tmp_path: Path) -> None:
    proc = run_fa_images(["wheel", "--sdist", "x.tar.gz", "--out", tmp_path, "--shard", "4/3"])
    assert proc.returncode == 2
    assert "4/3" in proc.stderr and "does not exist" in proc.stderr and "Traceback" not in proc.stderr


def test_a_shard_needs_the_compiler_cache(run_fa_images, tmp_path: Path) -> None:
    proc = run_fa_images(["wheel", "--sdist", "x.tar.gz", "--out", tmp_path, "--shard", "1/2"])
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: --shard needs --compiler-cache"), proc.stderr


def test_every_flash_attn_kernel_lands_in_exactly_one_balanced_shard() -> None:
    kernels = [f"csrc/flash_attn/src/{k}.cu" for k in COSTS["kernels"] if k != "flash_api"]
    cost = lambda s: expected_seconds(s, COSTS)  # noqa: E731
    for count in (2, 3, 4, 8):
        parts = shards.partition(kernels, count, cost)
        assert sorted(k for p in parts for k in p) == sorted(kernels)
        loads = [sum(map(cost, p)) for p in parts]
        # LPT: the heaviest shard is within one longest kernel of the mean
        assert max(loads) - sum(loads) / count <= max(map(cost, kernels))
        for part in parts:
            assert part == longest_first(part, COSTS)  # each shard starts its longest first


def test_shards_skip_the_python_specific_sources() -> None:
    sources = ["csrc/flash_api.cpp", "csrc/a.cu", "csrc/b.cu"]
    mine = [shards.kernels_of(sources, shards.Shard(i, 2), lambda _s: 1.0) for i in (1, 2)]
    assert mine == [["csrc/a.cu"], ["csrc/b.cu"]]


def test_more_shards_than_kernels_leaves_some_empty() -> None:
    assert shards.partition(["a.cu"], 3, lambda _s: 1.0) == [["a.cu"], [], []]


def test_the_final_run_needs_every_shard(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    done = tmp_path / "shards"
    with pytest.raises(BuildFailed, match="no shard finished"):
        shards.check_shards_done(done, settings)
    shards.write_record(done, shards.Shard(1, 3), ["a.cu"], settings)
    shards.write_record(done, shards.Shard(3, 3), ["c.cu"], settings)
    with pytest.raises(BuildFailed, match=r"shard 2/3 did not finish \(no shard-2-of-3.json in .*killed"):
        shards.check_shards_done(done, settings)
    shards.write_record(done, shards.Shard(2, 3), ["b.cu"], settings)
    assert shards.check_shards_done(done, settings) == 3


def test_shards_of_other_inputs_are_refused(tmp_path: Path) -> None:
    done = tmp_path / "shards"
    shards.write_record(done, shards.Shard(1, 1), ["a.cu"], make_settings(tmp_path, torch="2.8.0+cu128"))
    with pytest.raises(BuildFailed, match=r"other inputs than this run \(torch differ"):
        shards.check_shards_done(done, make_settings(tmp_path))


def test_mixed_splits_are_refused(tmp_path: Path) -> None:
    done = tmp_path / "shards"
    shards.write_record(done, shards.Shard(1, 1), ["a.cu"], make_settings(tmp_path))
    shards.write_record(done, shards.Shard(1, 2), ["a.cu"], make_settings(tmp_path))
    with pytest.raises(BuildFailed, match="mixes shard counts"):
        shards.check_shards_done(done, make_settings(tmp_path))


def test_a_record_that_is_not_json_is_refused(tmp_path: Path) -> None:
    done = tmp_path / "shards"
    done.mkdir()
    (done / "shard-1-of-1.json").write_text("[1, 2")
    with pytest.raises(ValueError, match="not valid JSON"):
        shards.check_shards_done(done, make_settings(tmp_path))
