"""The setup.py shim: flash_attn_2_cuda's flags corrected in the extension object, not by sed.

Unit tests on setuptools Extension objects, the shim run on small setup.py files with this
Python (CPU torch), and the shim run on the real flash-attn setup.py files with the toolchain
venv (torch 2.9.1+cu128) and the CUDA 12.4 toolkit, with ``--name`` so nothing compiles.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from fixtures.build_settings import make_settings
from setuptools import Extension

from fa_images.builder import contract, environment
from fa_images.builder.generations import fa2
from fa_images.builder.settings import BuildSettings
from fa_images.builder.setup_shim import (
    EXTENSION,
    ShimError,
    _strip_abi_flags,
    _strip_arch_flags,
    _strip_std_flags,
    correct_extension,
    cxx_standard,
    pin_torch_requirement,
    torch_default_standard,
    torch_pin,
)

GENCODE_80 = "arch=compute_80,code=sm_80"
GENCODE_90 = "arch=compute_90,code=sm_90"
SHIM_FAILED = contract.EXIT_SHIM_REFUSED


# --- flag stripping ----------------------------------------------------------------------


def test_strip_arch_flags_removes_gencode_pairs_and_keeps_the_rest() -> None:
    flags = ["-O3", "-gencode", GENCODE_80, "--use_fast_math", "-gencode", GENCODE_90, "--threads", "4"]
    kept, removed = _strip_arch_flags(flags)
    assert kept == ["-O3", "--use_fast_math", "--threads", "4"]
    assert removed == [GENCODE_80, GENCODE_90]


@pytest.mark.parametrize(
    ("flags", "removed"),
    [
        (["-gencode=arch=compute_75,code=sm_75"], ["arch=compute_75,code=sm_75"]),
        (["--generate-code", GENCODE_90], [GENCODE_90]),
        (["--generate-code=arch=compute_90,code=[sm_90,compute_90]"], ["arch=compute_90,code=[sm_90,compute_90]"]),
        (["-arch=sm_80"], ["sm_80"]),
        (["-arch", "sm_90"], ["sm_90"]),
        (["--gpu-architecture=compute_90"], ["compute_90"]),
        (["--gpu-architecture", "sm_100"], ["sm_100"]),
    ],
)
def test_strip_arch_flags_knows_every_spelling(flags: list[str], removed: list[str]) -> None:
    kept, got = _strip_arch_flags(["-O3", *flags, "--threads", "2"])
    assert kept == ["-O3", "--threads", "2"]
    assert got == removed


def test_strip_arch_flags_keeps_flags_that_only_look_alike() -> None:
    flags = ["-Xptxas", "-v", "--archive-options", "x", "-gencode-check"]
    assert _strip_arch_flags(flags) == (flags, [])


def test_strip_abi_flags_handles_the_field_sed_recipe() -> None:
    # What the usual "sed -i" recipe leaves in flash-attn's nvcc flags.
    flags = ["-O3", "-Xcompiler", "-D_GLIBCXX_USE_CXX11_ABI=0", "-Xcompiler", "-fPIC", "--threads", "4"]
    assert _strip_abi_flags(flags) == ["-O3", "-Xcompiler", "-fPIC", "--threads", "4"]


@pytest.mark.parametrize(
    "abi_flags",
    [
        ["-D_GLIBCXX_USE_CXX11_ABI=0"],
        ["-D_GLIBCXX_USE_CXX11_ABI=1"],
        ["-Xcompiler=-D_GLIBCXX_USE_CXX11_ABI=0"],
        ["-Xcompiler", "-D_GLIBCXX_USE_CXX11_ABI=1"],
        ["-U_GLIBCXX_USE_CXX11_ABI"],
    ],
)
def test_strip_abi_flags_removes_every_form(abi_flags: list[str]) -> None:
    assert _strip_abi_flags(["-O3", *abi_flags, "-std=c++17"]) == ["-O3", "-std=c++17"]


def test_a_trailing_xcompiler_is_kept() -> None:
    assert _strip_abi_flags(["-O3", "-Xcompiler"]) == ["-O3", "-Xcompiler"]


# --- correct_extension -------------------------------------------------------------------


def flash_attn_like_extension(cxx: list[str], nvcc: list[str]) -> Extension:
    return Extension(EXTENSION, sources=["csrc/flash_api.cpp"], extra_compile_args={"cxx": cxx, "nvcc": nvcc})


def test_correct_extension_sets_the_abi_and_exactly_the_archs() -> None:
    ext = flash_attn_like_extension(
        cxx=["-O3", "-std=c++17", "-D_GLIBCXX_USE_CXX11_ABI=0"],
        nvcc=[
            "-O3",
            "-gencode",
            GENCODE_80,
            "-gencode",
            GENCODE_90,
            "-Xcompiler",
            "-D_GLIBCXX_USE_CXX11_ABI=0",
            "--threads",
            "4",
        ],
    )
    line = correct_extension(ext, make_settings(archs=("90",), cxx11_abi=True))
    assert ext.extra_compile_args["cxx"] == ["-O3", "-std=c++17", "-D_GLIBCXX_USE_CXX11_ABI=1"]
    assert ext.extra_compile_args["nvcc"] == [
        "-O3",
        "--threads",
        "4",
        "-gencode",
        GENCODE_90,
        "-std=c++17",
        "-D_GLIBCXX_USE_CXX11_ABI=1",
    ]
    assert line == (
        f"{EXTENSION}: -D_GLIBCXX_USE_CXX11_ABI=1, archs 90 (setup.py asked for: {GENCODE_80}, {GENCODE_90}); "
        "-std=c++17 (torch 2.9 < 2.12: flash-attn's own c++17; setup.py asked for: -std=c++17)"
    )


def test_correct_extension_old_abi_and_ptx_of_the_newest_arch() -> None:
    ext = flash_attn_like_extension(cxx=["-O3"], nvcc=["-O3"])
    line = correct_extension(ext, make_settings(archs=("80", "120", "90"), cxx11_abi=False, ptx=True))
    assert ext.extra_compile_args["cxx"] == ["-O3", "-std=c++17", "-D_GLIBCXX_USE_CXX11_ABI=0"]
    assert ext.extra_compile_args["nvcc"] == [
        "-O3",
        "-gencode",
        GENCODE_80,
        "-gencode",
        "arch=compute_120,code=sm_120",
        "-gencode",
        GENCODE_90,
        "-gencode",
        "arch=compute_120,code=compute_120",
        "-std=c++17",
        "-D_GLIBCXX_USE_CXX11_ABI=0",
    ]
    assert "+PTX" in line and "(setup.py asked for: none)" in line


def test_correct_extension_is_idempotent() -> None:
    ext = flash_attn_like_extension(cxx=["-O3"], nvcc=["-O3", "-gencode", GENCODE_80])
    settings = make_settings(archs=("80", "90"))
    correct_extension(ext, settings)
    once = json.dumps(ext.extra_compile_args)
    correct_extension(ext, settings)
    assert json.dumps(ext.extra_compile_args) == once


# --- the C++ standard ----------------------------------------------------------------------

# torch -> the standard flash-attn is compiled with. torch 2.14's ATen.h refuses c++17, and torch's
# own cpp_extension compiles with c++20 from 2.12 on (measured: ../shared facts, the C++ standard).
STANDARD_TABLE = [
    ("2.6.0+cu124", None, "c++17"),
    ("2.9.1+cu128", None, "c++17"),
    ("2.11.0+cu130", "c++17", "c++17"),  # torch's default then was c++17 too; the rule decides anyway
    ("2.12.0", None, "c++20"),
    ("2.13.0+cpu", "c++20", "c++20"),
    ("2.14.1+cu130", "c++20", "c++20"),
    ("2.14.0", None, "c++20"),  # torch's source not readable: the rule's c++20
    ("2.15.0+cu132", "c++20", "c++20"),
    ("2.16.0", "c++23", "c++23"),  # a later torch that moves on is followed
    ("3.0.0", "nonsense", "c++20"),  # something unreadable is not trusted
    ("2.13.0a0+git1234", None, "c++20"),  # a source build of torch
]


@pytest.mark.parametrize(("torch_version", "torch_default", "standard"), STANDARD_TABLE)
def test_cxx_standard_follows_torch(torch_version: str, torch_default: str | None, standard: str) -> None:
    got, why = cxx_standard(torch_version, torch_default)
    assert got == standard
    assert ("< 2.12" in why) == (standard == "c++17") and torch_version.split(".")[1] in why


def test_cxx_standard_refuses_what_is_no_torch_version() -> None:
    with pytest.raises(ShimError, match="cannot read a torch version"):
        cxx_standard("latest")


def test_torch_default_standard_is_read_from_the_installed_torch(system_torch: dict) -> None:
    """This Python's torch (2.13 from .ci/setup) compiles extensions with c++20, a torch before
    2.12 with c++17; read, not assumed."""
    major, minor = (int(x) for x in system_torch["version"].split(".")[:2])
    assert torch_default_standard() == ("c++20" if (major, minor) >= (2, 12) else "c++17")


@pytest.mark.parametrize(
    ("flags", "kept"),
    [
        (["-O3", "-std=c++17"], ["-O3"]),
        (["-O3", "--std=c++17", "-DX"], ["-O3", "-DX"]),
        (["-std", "c++17", "-O3"], ["-O3"]),
        (["--std", "c++14", "-O3"], ["-O3"]),
        (["-Xcompiler", "-std=c++17", "-Xcompiler", "-fPIC"], ["-Xcompiler", "-fPIC"]),
        (["-Xcompiler=-std=c++17", "-O3"], ["-O3"]),
        (["--compiler-options", "-std=gnu++17", "-O3"], ["-O3"]),
        (["-O3", "-std"], ["-O3", "-std"]),  # a dangling -std is left for the compiler to refuse
        (["-stdlib=libc++", "-O3"], ["-stdlib=libc++", "-O3"]),  # only looks alike
    ],
)
def test_strip_std_flags_knows_every_spelling(flags: list[str], kept: list[str]) -> None:
    assert _strip_std_flags(flags) == kept


# The -std part of each flash-attn setup.py shape (checked in the sdists): 2.6.3 and 2.7.4.post1
# write the flags inline, 2.8.x through `compiler_c17_flag` and `nvcc_flags`; all say c++17 in both.
SETUP_PY_SHAPES = {
    "2.6.3": (
        ["-O3", "-std=c++17", "-lineinfo"],
        ["-O3", "-std=c++17", "-U__CUDA_NO_HALF_OPERATORS__", "-gencode", GENCODE_80, "--threads", "4"],
    ),
    "2.7.4.post1": (
        ["-O3", "-std=c++17"],
        ["-O3", "-std=c++17", "--use_fast_math", "-gencode", GENCODE_80, "--threads", "4"],
    ),
    "2.8.3": (
        ["-O3", "-std=c++17"],
        ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-gencode", GENCODE_80, "--threads", "4"],
    ),
}


@pytest.mark.parametrize("version", sorted(SETUP_PY_SHAPES))
@pytest.mark.parametrize(("torch_version", "standard"), [("2.11.0+cu130", "c++17"), ("2.14.1+cu130", "c++20")])
def test_correct_extension_sets_one_standard_in_both_compilers(version: str, torch_version: str, standard: str) -> None:
    cxx, nvcc = SETUP_PY_SHAPES[version]
    ext = flash_attn_like_extension(cxx=list(cxx), nvcc=list(nvcc))
    line = correct_extension(ext, make_settings(flash_attn=version, torch=torch_version), "c++20")
    for flags in ext.extra_compile_args.values():
        assert [f for f in flags if "std" in f] == [f"-std={standard}"], flags  # nvcc refuses two
    kept_cxx = [f for f in cxx if not f.startswith("-std")]
    assert ext.extra_compile_args["cxx"] == [*kept_cxx, f"-std={standard}", "-D_GLIBCXX_USE_CXX11_ABI=1"]
    assert f"; -std={standard} (torch {torch_version[:4]} " in line and "setup.py asked for: -std=c++17)" in line


@pytest.mark.parametrize("args", [None, ["-O3"], {"cxx": ["-O3"]}, {"nvcc": ["-O3"]}])
def test_correct_extension_refuses_a_shape_it_does_not_know(args) -> None:
    ext = Extension(EXTENSION, sources=["x.cpp"])
    ext.extra_compile_args = args
    with pytest.raises(ShimError, match=r"cannot correct flash-attn 2\.8\.3"):
        correct_extension(ext, make_settings())


# --- the torch pin in the wheel's metadata -------------------------------------------------

PIN_TABLE = [
    (["torch", "einops"], "2.9.1+cu128", ["torch==2.9.*", "einops"], "torch"),
    (["einops", "torch>=2.0", "packaging"], "2.14.1", ["torch==2.14.*", "einops", "packaging"], "torch>=2.0"),
    ("torch\neinops  # comment\n\n", "2.13.0+cpu", ["torch==2.13.*", "einops"], "torch"),
    (None, "2.11.0+cu130", ["torch==2.11.*"], "no torch"),
    (["Torch; platform_system == 'Linux'", "ninja"], "2.10.0", ["torch==2.10.*", "ninja"], "Torch; platform_system"),
]


@pytest.mark.parametrize(("requires", "torch_version", "pinned", "asked"), PIN_TABLE)
def test_pin_torch_requirement(requires, torch_version: str, pinned: list[str], asked: str) -> None:
    got, line = pin_torch_requirement(requires, torch_version)
    assert got == pinned
    assert line.startswith(f"requires {pinned[0]} (setup.py asked for: {asked}")


def test_the_pin_is_matched_by_the_torch_it_was_built_with_and_no_other() -> None:
    from packaging.requirements import Requirement

    spec = Requirement(torch_pin("2.9.1+cu128")).specifier
    assert spec.contains("2.9.1+cu128") and spec.contains("2.9.0")
    assert not spec.contains("2.10.0") and not spec.contains("2.8.0+cu128")


def test_a_broken_requirement_is_refused() -> None:
    with pytest.raises(ShimError, match="not a requirement"):
        pin_torch_requirement(["torch>>2"], "2.9.1")


# --- the environment the shim runs in ----------------------------------------------------


def test_build_environment_unsets_what_would_change_the_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("FLASH_ATTENTION_FORCE_CXX11_ABI", "FLASH_ATTENTION_SKIP_CUDA_BUILD", "FLASH_ATTN_LOCAL_VERSION"):
        monkeypatch.setenv(var, "TRUE")
    nvcc = environment.NvccInfo(path=tmp_path / "cuda" / "bin" / "nvcc", version="12.8")
    env = fa2.build_environment(make_settings(archs=("80", "90", "100", "120")), nvcc)
    assert "FLASH_ATTENTION_FORCE_CXX11_ABI" not in env
    assert "FLASH_ATTENTION_SKIP_CUDA_BUILD" not in env
    assert env["FLASH_ATTN_LOCAL_VERSION"] == "cu128torch2.9cxx11abitrue"
    assert env["FLASH_ATTENTION_FORCE_BUILD"] == "TRUE"
    assert env["FLASH_ATTN_CUDA_ARCHS"] == "80;90;100;120"
    assert env["TORCH_CUDA_ARCH_LIST"] == "8.0;9.0;10.0;12.0"
    assert (env["MAX_JOBS"], env["NVCC_THREADS"]) == ("2", "2")
    assert env["CUDA_HOME"] == str(tmp_path / "cuda")
    assert env["PATH"].split(os.pathsep)[0] == str(tmp_path / "cuda" / "bin")
    no_label = fa2.build_environment(make_settings(local_version=None), nvcc)
    assert "FLASH_ATTN_LOCAL_VERSION" not in no_label


# --- the shim on small setup.py files (this Python, CPU torch) ---------------------------

SMALL_SETUP = """\
import os
import torch
from setuptools import Extension, setup

if os.environ.get("FLIP_ABI"):  # what FLASH_ATTENTION_FORCE_CXX11_ABI does, the other way round
    torch._C._GLIBCXX_USE_CXX11_ABI = not torch._C._GLIBCXX_USE_CXX11_ABI
ext_modules = []
if os.environ.get("FLASH_ATTENTION_SKIP_CUDA_BUILD") != "TRUE":
    ext_modules.append(Extension(
        "flash_attn_2_cuda", sources=["csrc/flash_api.cpp"],
        extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3", "-gencode", "arch=compute_80,code=sm_80",
                                                     "--threads", "4"]},
    ))
dist = setup(name="flash_attn", version="2.8.3", ext_modules=ext_modules, install_requires=["torch", "einops"])
print("ABI-AT-SETUP", bool(torch._C._GLIBCXX_USE_CXX11_ABI))
print("NVCC-FLAGS", dist.ext_modules[0].extra_compile_args["nvcc"])
print("REQUIRES", dist.install_requires)
"""


def run_shim(
    python: str,
    source_dir: Path,
    settings_file: Path,
    *setup_args: str,
    env: dict[str, str] | None = None,
    repo_root: Path,
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = str(repo_root)
    return subprocess.run(
        [python, "-m", "fa_images.builder.setup_shim", str(settings_file), *setup_args],
        cwd=source_dir,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def small_source(tmp_path: Path, system_torch: dict) -> tuple[Path, BuildSettings]:
    (tmp_path / "setup.py").write_text(SMALL_SETUP)
    settings = make_settings(tmp_path, cxx11_abi=system_torch["abi"], archs=("90",), torch=system_torch["version"])
    settings.write()
    return tmp_path, settings


def test_shim_corrects_a_small_setup_py(small_source, repo_root: Path) -> None:
    src, settings = small_source
    proc = run_shim(sys.executable, src, src / "fa_images_build.json", "--name", repo_root=repo_root)
    assert proc.returncode == 0, proc.stderr
    abi = settings.abi_define()
    assert f"[fa-images] {EXTENSION}: {abi}, archs 90 (setup.py asked for: arch=compute_80,code=sm_80)" in proc.stdout
    assert "flash_attn" in proc.stdout.splitlines()  # setup.py --name ran for real
    std = f"-std={cxx_standard(settings.torch, torch_default_standard())[0]}"
    nvcc = f"['-O3', '--threads', '4', '-gencode', 'arch=compute_90,code=sm_90', '{std}', '{abi}']"
    assert f"NVCC-FLAGS {nvcc}" in proc.stdout
    pin = torch_pin(settings.torch)
    assert f"REQUIRES ['{pin}', 'einops']" in proc.stdout
    assert f"; requires {pin} (setup.py asked for: torch)" in proc.stdout


def test_shim_restores_the_abi_attribute_a_setup_py_flipped(small_source, repo_root: Path) -> None:
    src, settings = small_source
    proc = run_shim(
        sys.executable, src, src / "fa_images_build.json", "--name", env={"FLIP_ABI": "1"}, repo_root=repo_root
    )
    assert proc.returncode == 0, proc.stderr
    assert f"ABI-AT-SETUP {settings.cxx11_abi}" in proc.stdout


def test_shim_refuses_settings_prepared_for_another_torch(small_source, repo_root: Path) -> None:
    src, settings = small_source
    replace(settings, cxx11_abi=not settings.cxx11_abi).write()
    proc = run_shim(sys.executable, src, src / "fa_images_build.json", "--name", repo_root=repo_root)
    assert proc.returncode == SHIM_FAILED
    assert "[fa-images] error: torch reports cxx11_abi=" in proc.stderr
    assert "prepare again with this torch" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_shim_fails_loudly_without_the_extension(small_source, repo_root: Path) -> None:
    src, _settings = small_source
    proc = run_shim(
        sys.executable,
        src,
        src / "fa_images_build.json",
        "--name",
        env={"FLASH_ATTENTION_SKIP_CUDA_BUILD": "TRUE"},
        repo_root=repo_root,
    )
    assert proc.returncode == SHIM_FAILED
    assert (
        f"[fa-images] error: setup.py of flash-attn 2.8.3 defines no {EXTENSION} extension "
        "(was FLASH_ATTENTION_SKIP_CUDA_BUILD set?)"
    ) in proc.stderr
    assert "flash_attn" not in proc.stdout.splitlines(), "setup() must not have run"


# --- the shim on the real flash-attn setup.py files (toolchain venv, CUDA 12.4) ----------

# What each real setup.py puts in -gencode when the builder asks for 80 only
# (FLASH_ATTN_CUDA_ARCHS=80): 2.6.3 ignores the variable and hard-codes 80 and 90.
ASKED_FOR_WHEN_80 = {
    "2.6.3": f"{GENCODE_80}, {GENCODE_90}",
    "2.7.4.post1": GENCODE_80,
    "2.8.3": GENCODE_80,
}


@pytest.fixture(scope="module")
def real_prepared(real_sdist, run_fa_images, venv_python: str, tmp_path_factory, prepare_only):
    """version -> (source dir, settings): prepared with the venv's torch, as the build would be."""
    cache: dict[str, tuple[Path, BuildSettings]] = {}

    def get(version: str) -> tuple[Path, BuildSettings]:
        if version not in cache:
            work = tmp_path_factory.mktemp(f"shim-{version}")
            proc = run_fa_images(
                prepare_only(
                    "--archs", "80", sdist=real_sdist(version), out=work / "dist", work=work, keep_work=True, json=True
                ),
                python=venv_python,
            )
            assert proc.returncode == 0, proc.stderr
            settings = BuildSettings.read(Path(json.loads(proc.stdout)["source_dir"]) / "fa_images_build.json")
            cache[version] = (Path(settings.source_dir), settings)
        return cache[version]

    return get


def shim_env(settings: BuildSettings, cuda_home: Path) -> dict[str, str]:
    nvcc = environment.NvccInfo(path=cuda_home / "bin" / "nvcc", version="12.4")
    return fa2.build_environment(settings, nvcc)


@pytest.mark.parametrize("version", sorted(ASKED_FOR_WHEN_80))
def test_shim_on_the_real_setup_py(
    version: str, real_prepared, venv_python: str, cuda_home: Path, repo_root: Path
) -> None:
    src, settings = real_prepared(version)
    assert settings.cxx11_abi is True and settings.cuda == "12.8"  # the venv's torch 2.9.1+cu128
    proc = run_shim(
        venv_python, src, src / "fa_images_build.json", "--name", env=shim_env(settings, cuda_home), repo_root=repo_root
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = (
        f"[fa-images] {EXTENSION}: -D_GLIBCXX_USE_CXX11_ABI=1, archs 80 "
        f"(setup.py asked for: {ASKED_FOR_WHEN_80[version]})"
    )
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith(expected)]
    # the venv's torch 2.9 keeps flash-attn's c++17; the wheel pins it
    assert "; -std=c++17 (torch 2.9 < 2.12: flash-attn's own c++17; setup.py asked for: -std=c++17)" in line
    assert line.endswith(
        "sources, longest first (compile_costs.json); requires torch==2.9.* (setup.py asked for: torch)"
    ), line
    assert "flash_attn" in proc.stdout.splitlines()


def test_the_real_kernels_are_ordered_longest_first(real_prepared) -> None:
    """setup.py lists the split-KV kernels, among the longest, last; ninja must start the longest first."""
    from fa_images.builder.setup_shim import COSTS_FILE, expected_seconds, longest_first

    costs = json.loads(COSTS_FILE.read_text())
    src, _settings = real_prepared("2.8.3")
    listed = sorted(str(p.relative_to(src)) for p in (src / "csrc" / "flash_attn" / "src").glob("*.cu"))
    listed.append("csrc/flash_attn/flash_api.cpp")
    ordered = longest_first(listed)
    seconds = [expected_seconds(s, costs) for s in ordered]
    assert seconds == sorted(seconds, reverse=True) and sorted(ordered) == sorted(listed)
    assert "flash_fwd_split_hdim64_fp16" in ordered[0]  # the longest step measured (551 s)
    assert ordered[-1] == "csrc/flash_attn/flash_api.cpp"
    assert listed.index(ordered[0]) > len(listed) // 2  # it was far down setup.py's list


def test_real_2_8_3_without_the_archs_variable_asks_for_its_defaults(
    real_prepared, venv_python: str, cuda_home: Path, repo_root: Path
) -> None:
    src, settings = real_prepared("2.8.3")
    env = shim_env(settings, cuda_home)
    del env["FLASH_ATTN_CUDA_ARCHS"]  # 2.8.3 then defaults to 80;90;100;120, and nvcc 12.4 drops 100 and 120
    proc = run_shim(venv_python, src, src / "fa_images_build.json", "--name", env=env, repo_root=repo_root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"archs 80 (setup.py asked for: {GENCODE_80}, {GENCODE_90})" in proc.stdout


@pytest.mark.parametrize("version", ["2.6.3", "2.8.3"])
def test_real_setup_py_without_the_extension_fails_loudly(
    version: str, real_prepared, venv_python: str, cuda_home: Path, repo_root: Path
) -> None:
    src, settings = real_prepared(version)
    env = {**shim_env(settings, cuda_home), "FLASH_ATTENTION_SKIP_CUDA_BUILD": "TRUE"}
    proc = run_shim(venv_python, src, src / "fa_images_build.json", "--name", env=env, repo_root=repo_root)
    assert proc.returncode == SHIM_FAILED, proc.stderr[-3000:]
    assert f"[fa-images] error: setup.py of flash-attn {version} defines no {EXTENSION} extension" in proc.stderr
    assert "Traceback" not in proc.stderr
