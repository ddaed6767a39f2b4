"""bench/side_by_side.py's parts: the trimmed sdist all three builds share, and memory that counts
the compiles a detached sccache server runs (a real build of a trimmed 2.8.3 is in bench/side_by_side.md)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from bench import peak_memory, trim_sdist
from fa_images.builder.setup_shim import COSTS_FILE, expected_seconds

TOP = "flash_attn-9.9"
SPECIALIZATION = "template<>\nvoid {0}<cutlass::{1}>({2} &params, cudaStream_t stream) {{\n    launch(params);\n}}"
INSTANTIATION = "template void {0}<cutlass::{1}>({2} &params, cudaStream_t stream);"
# file: entry point, in the two shapes flash-attn's generate_kernels.py writes
KERNELS = {
    "flash_fwd_split_hdim256_bf16_sm80.cu": INSTANTIATION.format(
        "run_mha_fwd_splitkv_dispatch", "bfloat16_t, 256, false", "Flash_fwd_params"
    ),
    "flash_bwd_hdim128_fp16_sm80.cu": SPECIALIZATION.format("run_mha_bwd_", "half_t, 128, false", "Flash_bwd_params"),
    "flash_fwd_hdim64_fp16_sm80.cu": SPECIALIZATION.format("run_mha_fwd_", "half_t, 64, false", "Flash_fwd_params"),
    "flash_fwd_hdim32_bf16_causal_sm80.cu": SPECIALIZATION.format(
        "run_mha_fwd_", "bfloat16_t, 32, true", "Flash_fwd_params"
    ),
}
ODD = "odd_kernel.cu"  # no entry point of the generated shape: never left out


def fake_sdist(dest: Path) -> Path:
    sources = ['"csrc/flash_attn/flash_api.cpp",'] + [f'"csrc/flash_attn/src/{k}",' for k in [*KERNELS, ODD]]
    setup = (
        'ext_modules.append(\n    CUDAExtension(\n        name="flash_attn_2_cuda",\n        sources=[\n'
        + "".join(f"            {s}\n" for s in sources)
        + "        ],\n    )\n)\n"
    )
    files = {"setup.py": setup, "csrc/flash_attn/flash_api.cpp": "// api\n", "csrc/flash_attn/src/flash.h": "// decl\n"}
    files["csrc/flash_attn/src/" + ODD] = "__global__ void odd() {}\n"
    for name, entry in KERNELS.items():
        launch = "flash_bwd_launch_template.h" if "bwd" in name else "flash_fwd_launch_template.h"
        files[f"csrc/flash_attn/src/{name}"] = (
            f'#include "namespace_config.h"\n#include "{launch}"\n\nnamespace FLASH_NAMESPACE {{\n\n{entry}\n\n}}\n'
        )
    dest.mkdir(parents=True)
    path = dest / f"{TOP}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(f"{TOP}/{name}")
            info.size, info.mtime = len(text.encode()), 1700000000
            tar.addfile(info, io.BytesIO(text.encode()))
    return path


def members(sdist: Path) -> dict[str, str]:
    with tarfile.open(sdist) as tar:
        return {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_the_trimmed_sdist_compiles_n_kernels_chosen_by_cost_and_stubs_the_rest(tmp_path: Path) -> None:
    trimmed = trim_sdist.trim(fake_sdist(tmp_path / "in"), 2, tmp_path / "out")
    costs = json.loads(COSTS_FILE.read_text())
    by_cost = sorted(KERNELS, key=lambda k: (-expected_seconds(k, costs), k))
    chosen = [by_cost[1], by_cost[3]]  # the middle of each half of the longest-first order
    src = "csrc/flash_attn/src/"
    assert trimmed.kept == [src + k for k in KERNELS if k in chosen] + [src + ODD]
    assert trimmed.left_out == [src + k for k in KERNELS if k not in chosen]
    assert trimmed.never_left_out == [src + ODD]
    files = members(Path(trimmed.sdist))
    stub_path = src + "fa_bench_stubs.cu"
    expected = [stub_path if k == trimmed.left_out[0] else k for k in [src + n for n in [*KERNELS, ODD]]]
    expected = [k for k in expected if k not in trimmed.left_out]
    assert trim_sdist.kernel_sources(files[f"{TOP}/setup.py"]) == expected  # the stub where the first one was
    stub = files[f"{TOP}/{stub_path}"]
    assert '#include "flash.h"' in stub and "launch_template" not in stub  # declarations, not the kernels
    for kernel in trimmed.left_out:  # still in the copy, no longer compiled
        ((_namespace, signature),) = trim_sdist.entry_points(files[f"{TOP}/{kernel}"])
        assert f"template<> {signature} {{" in stub
    assert "template void" not in stub  # an instantiation left out becomes a specialization


def test_the_same_sdist_and_n_give_the_same_bytes(tmp_path: Path) -> None:
    sdist = fake_sdist(tmp_path / "in")
    one = trim_sdist.trim(sdist, 1, tmp_path / "one")
    two = trim_sdist.trim(sdist, 1, tmp_path / "two")
    assert Path(one.sdist).read_bytes() == Path(two.sdist).read_bytes()
    assert Path(one.sdist).name == sdist.name  # the builder reads the version from the copy as from the original


def test_asking_for_every_kernel_leaves_the_sdist_as_it_was(tmp_path: Path) -> None:
    sdist = fake_sdist(tmp_path / "in")
    trimmed = trim_sdist.trim(sdist, 10, tmp_path / "out")
    assert trimmed.left_out == []
    assert members(Path(trimmed.sdist)) == members(sdist)


def test_a_setup_py_without_the_extension_is_refused() -> None:
    with pytest.raises(ValueError, match="no sources"):
        trim_sdist.kernel_sources("setup(name='x', ext_modules=[])\n")


def _detached(env: dict[str, str]) -> int:
    """The pid of a process that, like sccache's server, belongs to no one's tree but init's."""
    proc = subprocess.run(
        ["/bin/sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"],
        env=env,
        capture_output=True,
        text=True,
        start_new_session=True,
        check=True,
    )
    return int(proc.stdout)


def test_the_cache_server_is_found_by_its_environment_outside_the_builds_tree(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    build = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    server = _detached({**os.environ, "SCCACHE_DIR": str(cache)})
    stranger = _detached({**os.environ, "SCCACHE_DIR": str(tmp_path / "another")})
    try:
        time.sleep(0.2)
        seen: set[int] = set()
        with_server = peak_memory.tree_sample(build.pid, cache, seen)
        assert seen == {server}  # not the other cache's process, not the build's own
        assert with_server > peak_memory.tree_sample(build.pid, None, set()) > 0
    finally:
        build.kill()
        build.wait()
        for pid in (server, stranger):
            os.kill(pid, signal.SIGKILL)


def test_a_meter_names_its_method_and_reads_a_build(tmp_path: Path) -> None:
    group, why = peak_memory.make_cgroup(f"fa-bench-test-{os.getpid()}")
    meter = peak_memory.Meter(None, group)
    cmd = [sys.executable, "-c", "x = bytearray(200 << 20); import time; time.sleep(2.5)"]
    proc = subprocess.Popen(group.wrap(cmd) if group else cmd)
    meter.start(proc.pid)
    proc.wait()
    memory = meter.stop()
    if group is not None:
        group.remove()
    assert proc.returncode == 0
    assert memory.method.startswith("cgroup v" if group else "process trees"), why
    assert memory.peak_gib >= 0.1  # the 200 MiB the build held


def test_the_gpu_check_trim_keeps_the_named_kernels_and_refuses_an_sdist_without_them(tmp_path: Path) -> None:
    kernels = [f"csrc/flash_attn/src/{k}" for k in KERNELS]
    assert trim_sdist.pick_named(kernels, ("flash_bwd_hdim128_fp16_sm80.cu",)) == [
        "csrc/flash_attn/src/flash_bwd_hdim128_fp16_sm80.cu"
    ]
    with pytest.raises(ValueError, match=r"setup\.py lists no flash_bwd_hdim128_bf16_causal_sm80\.cu, "):
        trim_sdist.trim(fake_sdist(tmp_path / "in"), None, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # refused before anything is written
    assert len(trim_sdist.GPU_CHECK_KERNELS) == 10
