"""FlashAttention-3: its build knobs, its source archive's reading (made from real git repositories
in the builder tier, test_builder_fa3.py), the builder's refusals and environment, `inspect` of an
abi3 wheel, the matrix's FA3 entries and their Dockerfile, and the GPU check's dispatch. The real
build and GPU check ran on an H100 (bench/gpu_container/fa3_check.sh, bench/gpu_container.md)."""

from __future__ import annotations

import gzip
import io
import tarfile
import zipfile
from pathlib import Path

import pytest
from test_gpu_arch import H100, extension

from fa_images.builder import contract, generations, gpucheck, verify
from fa_images.builder import source as source_mod
from fa_images.builder.environment import NvccInfo
from fa_images.builder.errors import SourceError, UsageError
from fa_images.builder.generations import fa3
from fa_images.builder.settings import BuildSettings

TRIMMED = dict(head_dims=(128,), dtypes=("bf16", "fp16"), without=("split", "paged_kv", "sm80"))

# --- the build's knobs --------------------------------------------------------------------------


def test_the_default_is_upstreams_full_build_and_sets_every_switch_off() -> None:
    full = fa3.Fa3Build()
    assert full.full and full.label() == "" and full.archs == ("80", "90a")
    env = full.environment()
    # Every FLASH_ATTENTION_DISABLE_* hopper/setup.py reads (19 at 3.0.0), set: none is left to the caller's env.
    assert set(env.values()) == {"FALSE"} and len(env) == 19
    assert fa3.local_version_label("13.0", full) == "cu13"


def test_a_trimmed_build_is_named_by_what_it_leaves_out() -> None:
    trimmed = fa3.Fa3Build(**TRIMMED)
    env = trimmed.environment()
    off = sorted(k.removeprefix("FLASH_ATTENTION_DISABLE_") for k, v in env.items() if v == "TRUE")
    assert off == ["FP8", "HDIM192", "HDIM256", "HDIM64", "HDIM96", "PAGEDKV", "SM80", "SPLIT"]
    assert trimmed.archs == ("90a",) and not trimmed.full
    assert fa3.local_version_label("13.0", trimmed) == f"cu13.{trimmed.label()}"
    assert trimmed.label() != fa3.Fa3Build(head_dims=(128,)).label()
    assert trimmed.describe() == "hdim 128; bf16,fp16; without split,paged_kv,sm80"
    # The builder's flags ask for the same build, in any order the user wrote it.
    assert fa3.Fa3Build.parse(*(a for a in trimmed.arguments()[1::2])) == trimmed
    assert fa3.Fa3Build(head_dims=(128, 128), dtypes=("fp16", "bf16"), without=("sm80", "split", "paged_kv")) == trimmed


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        (dict(head_dims=(100,)), "head dims [100]"),
        (dict(head_dims=()), "head dims []"),
        (dict(dtypes=("fp16",)), "bf16 is always built"),
        (dict(dtypes=("bf16", "fp32")), "dtypes"),
        (dict(without=("fp8",)), "features ['fp8']"),
    ],
)
def test_a_build_fa3_cannot_make_is_refused(kwargs, says: str) -> None:
    with pytest.raises(UsageError, match=says.replace("[", r"\[").replace("]", r"\]")):
        fa3.Fa3Build(**kwargs)


def test_what_a_wheel_records_of_its_build_reads_back() -> None:
    """flash_attn_config.CONFIG as hopper/setup.py writes it: its own key names (SM8x, HDIMDIFF)."""
    trimmed = fa3.Fa3Build(**TRIMMED)
    flags = {"FLASHATTENTION_ENABLE_VCOLMAJOR": False}
    for name, off in trimmed.disabled().items():
        key = {"SM80": "FLASHATTENTION_DISABLE_SM8x"}.get(name, f"FLASHATTENTION_DISABLE_{name}")
        key = f"FLASH_ATTENTION_DISABLE_{name}" if name.startswith("HDIMDIFF") else key
        flags[key] = off
    assert fa3.Fa3Build.from_config({"build_flags": flags}) == trimmed
    with pytest.raises(ValueError):
        fa3.Fa3Build.from_config({"build_flags": {**flags, "FLASHATTENTION_DISABLE_SPLIT": "yes"}})


@pytest.mark.parametrize(
    ("cuda", "refused"),
    [("12.2", "needs CUDA >= 12.3"), ("12.6", "downloads nvcc 12.6"), ("12.9", "downloads"), ("12.8", None)]
    + [("13.0", None), ("13.2", None)],
)
def test_a_cuda_whose_build_would_download_a_toolchain_is_refused(cuda: str, refused: str | None) -> None:
    why = fa3.refuse_cuda(cuda)
    assert (why is None) if refused is None else (refused in (why or ""))


# --- the source archive, read ---------------------------------------------------------------------


def _tar_gz(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_an_archive_without_cutlass_or_hopper_is_refused(tmp_path: Path) -> None:
    no_cutlass = tmp_path / "a.tar.gz"
    no_cutlass.write_bytes(_tar_gz({"x/hopper/setup.py": b"", "x/hopper/__init__.py": b'__version__ = "3.0.0"\n'}))
    with pytest.raises(SourceError, match="cutlass is missing"):
        fa3.unpack(no_cutlass, tmp_path / "s1", None)
    sdist = tmp_path / "b.tar.gz"
    sdist.write_bytes(_tar_gz({"flash_attn-2.8.3/setup.py": b""}))
    with pytest.raises(SourceError, match=r"no hopper/setup\.py"):
        fa3.unpack(sdist, tmp_path / "s2", None)


def test_an_archive_that_inflates_past_the_bound_is_refused_unread(tmp_path: Path, monkeypatch) -> None:
    bomb = tmp_path / "flash_attn_3-3.0.0.tar.gz"
    bomb.write_bytes(gzip.compress(b"\0" * (4 << 20)))  # 4 MiB of zeros in a few kB
    monkeypatch.setattr(source_mod, "MAX_UNPACKED", 1 << 20)
    with pytest.raises(SourceError, match="unpacks past 1 MiB"):
        source_mod.tar_sha256(bomb)


# --- the builder -----------------------------------------------------------------------------------


def test_the_build_environment_sets_every_knob_and_inherits_none(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FLASH_ATTENTION_DISABLE_BACKWARD", "TRUE")  # would silently drop the backward
    monkeypatch.setenv("FLASH_ATTENTION_SKIP_CUDA_BUILD", "TRUE")
    monkeypatch.setenv("FLASH_ATTENTION_TRITON_AMD_ENABLE", "TRUE")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    src = tmp_path / "flash_attn_3-3.0.0" / "hopper"
    settings = BuildSettings(
        flash_attn="3.0.0", python="3.12", torch="2.11.0", cuda="13.0", cxx11_abi=True, archs=("90a",), ptx=False,
        max_jobs=4, nvcc_threads=1, local_version="cu13.kabc", source_dir=str(src), sdist="a", sha256="0" * 64,
        honours_cuda_archs_env=False, generation=3, knobs={"head_dims": [128], "dtypes": ["bf16"], "without": []},
    )  # fmt: skip
    env = fa3.setup_environment(settings, NvccInfo(path=Path("/usr/local/cuda/bin/nvcc"), version="13.0"))
    assert env["FLASH_ATTENTION_DISABLE_BACKWARD"] == "FALSE" and env["FLASH_ATTENTION_DISABLE_HDIM64"] == "TRUE"
    assert "FLASH_ATTENTION_SKIP_CUDA_BUILD" not in env and "FLASH_ATTENTION_TRITON_AMD_ENABLE" not in env
    assert "TORCH_CUDA_ARCH_LIST" not in env
    assert env["FLASH_ATTENTION_FORCE_BUILD"] == "TRUE" and env["FLASH_ATTENTION_OFFLINE_BUILD"] == "TRUE"
    assert env["GIT_CEILING_DIRECTORIES"] == str(src.parent) and env["FLASH_ATTN_LOCAL_VERSION"] == "cu13.kabc"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--archs", "80"], "--archs is not for FlashAttention-3"),
        (["--ptx"], "--ptx is not for FlashAttention-3"),
        (["--fa3-head-dims", "100"], "head dims [100]"),
        (["--fa3-head-dims", "x"], "comma-separated numbers"),
        (["--fa3-without", "fp8"], "features ['fp8']"),
    ],
)
def test_the_builder_refuses_what_fa3_cannot_take_before_probing(args: list[str], says: str, tmp_path, capsys) -> None:
    from fa_images.builder.cli import main

    code = main(["wheel", "--flash-attn", "3.0.0", "--out", str(tmp_path), *args])
    assert code == 2 and says in capsys.readouterr().err


def test_fa3_flags_on_a_flash_attn_2_build_are_refused(tmp_path: Path, capsys) -> None:
    from fa_images.builder.cli import main

    assert main(["wheel", "--flash-attn", "2.8.3", "--out", str(tmp_path), "--fa3-head-dims", "128"]) == 2
    assert "--fa3-head-dims: for a FlashAttention-3 build, not FlashAttention-2" in capsys.readouterr().err


def test_a_missing_archive_names_the_command_that_makes_it(tmp_path: Path, capsys) -> None:
    from fa_images.builder.cli import main

    code = main(["wheel", "--flash-attn", "3.0.0", "--sources-dir", str(tmp_path), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 4 and "FlashAttention-3 is not on PyPI" in err and "fa-images source fa3" in err


def test_an_archive_taken_by_its_name_is_held_to_its_pin(tmp_path: Path, capsys) -> None:
    """`wheel --flash-attn 3.0.0` takes "its pinned source archive": a file of that name is not
    built (nor prepared) unless its pin is given, and then only if it matches."""
    from fa_images.builder.cli import main

    (tmp_path / "flash_attn_3-3.0.0.tar.gz").write_bytes(b"any bytes under the pinned name")
    base = ["wheel", "--flash-attn", "3.0.0", "--sources-dir", str(tmp_path), "--prepare-only"]
    assert main([*base, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "taken from" in err and "give --sha256, its pin" in err
    assert main([*base, "--sha256", "0" * 64, "--out", str(tmp_path / "o")]) == 4
    assert "error:" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() or not list((tmp_path / "o").iterdir())


# --- inspect: an abi3 wheel -----------------------------------------------------------------------


def fa3_wheel(dest: Path, *, config: bool = True, tag: str = "cp39-abi3-linux_x86_64") -> Path:
    version = "3.0.0+cu13"
    info = f"flash_attn_3-{version}.dist-info"
    build_flags = {"FLASHATTENTION_DISABLE_SM8x": False, "FLASHATTENTION_DISABLE_HDIM64": False}
    so = bytearray(extension([80, 90]))
    so[0x12:0x14] = (62).to_bytes(2, "little")  # e_machine: x86-64, as its platform tag says
    files = {
        "flash_attn_3/_C.abi3.so": bytes(so),
        "flash_attn_interface.py": b"# FA3\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: flash_attn_3\nVersion: {version}\n"
        "Requires-Dist: torch\nRequires-Dist: einops\n".encode(),
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}\n".encode(),
    }
    if config:
        files["flash_attn_config.py"] = f"CONFIG = {{'build_flags': {build_flags!r}}}\n".encode()
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"flash_attn_3-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"{info}/RECORD", "".join(f"{n},,\n" for n in files))
    return path


def test_inspect_reads_an_fa3_wheel_as_fa3(tmp_path: Path) -> None:
    report = verify.inspect_wheel(fa3_wheel(tmp_path), import_check=False, gpus=[("NVIDIA H100", H100)])
    checks = {c.name: (c.status, c.detail) for c in report.checks}
    assert report.ok, report.problems()
    assert report.generation == 3 and report.extension == "flash_attn_3/_C.abi3.so"
    assert checks["platform tag"] == ("pass", "cp39-abi3-linux_x86_64: every Python >= 3.9")
    assert checks["torch pin"][0] == "pass" and "stable ABI" in checks["torch pin"][1]
    assert checks["FA3 build"][0] == "pass" and report.built_with == "hdim 64,96,128,192,256; bf16,fp16,fp8"
    assert "runs it" in checks["GPU code"][1]


def test_an_fa3_wheel_without_its_build_record_or_abi3_tag_is_not_sound(tmp_path: Path) -> None:
    report = verify.inspect_wheel(fa3_wheel(tmp_path / "a", config=False), import_check=False, gpus=[])
    assert any(c.name == "FA3 build" and c.status == "fail" for c in report.checks)
    tagged = fa3_wheel(tmp_path / "b", tag="cp312-cp312-linux_x86_64")
    report = verify.inspect_wheel(tagged, import_check=False, gpus=[])
    assert "is not cp3X-abi3-linux_x86_64" in " ".join(report.problems())


def test_an_abi3_wheel_serves_newer_pythons_not_older_ones(tmp_path: Path) -> None:
    wheel = fa3_wheel(tmp_path, tag="cp310-abi3-linux_x86_64")
    assert verify.inspect_wheel(wheel, expect_python="3.13", import_check=False, gpus=[]).ok
    older = verify.inspect_wheel(wheel, expect_python="3.9", import_check=False, gpus=[])
    assert "is for Python >= 3.10, expected 3.9" in " ".join(older.problems())


# --- the GPU check's dispatch ----------------------------------------------------------------------


def test_the_check_runs_the_generation_installed_and_judges_the_arch_by_its_build(monkeypatch) -> None:
    """sm_90a runs on 9.0 only; a build without the sm80 kernels does not run on an A100, whatever
    sm_80 code its scheduler carries."""
    import torch

    from fa_images.builder.generations import fa3_check

    ran: list[str] = []
    monkeypatch.setattr(gpucheck, "installed", lambda: [generations.FA3])
    monkeypatch.setattr(fa3_check, "import_check", lambda: "flash_attn_3 imports")
    monkeypatch.setattr(fa3_check, "installed_build", lambda: fa3.Fa3Build(**TRIMMED))
    monkeypatch.setattr(fa3_check, "cases", lambda build: ran.append(build.describe()) or [])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda _i=0: "NVIDIA Test GPU")
    lines: list[str] = []
    for capability, code in ((H100, 0), ((10, 0), contract.EXIT_WRONG_ARCH), ((8, 0), contract.EXIT_WRONG_ARCH)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda _i=0, c=capability: c)
        assert gpucheck.run(out=lines.append) == code
    assert ran == [fa3.Fa3Build(**TRIMMED).describe()]  # the kernels ran on the H100 only
    assert any(line.startswith("PASS: FlashAttention-3: 0 comparisons with an fp32 reference") for line in lines)
    assert "this GPU is sm_80; the extension carries sm_90a" in lines[-1]


def test_no_flash_attn_installed_is_a_failed_import() -> None:
    lines: list[str] = []
    assert gpucheck.run(out=lines.append) == 1  # the unit tier installs neither generation
    assert lines == ["FAIL: import: no flash-attn is installed here (none of flash-attn, flash-attn-3, flash-attn-4)"]


# --- the matrix: FA3 entries, their refusals, their Dockerfile ------------------------------------

TRIMMED_YAML = "fa3: {head_dims: [128], dtypes: [bf16, fp16], without: [split, paged_kv, sm80]}\n"


def load(tmp_path: Path, text: str):
    from fa_images.config import matrix

    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    return matrix.load(path)


def test_fa3_entries_share_one_compile_group_across_pythons_and_torches(tmp_path: Path) -> None:
    m = load(
        tmp_path,
        TRIMMED_YAML + 'matrix: {python: ["3.12", "3.13"], torch: ["2.9.1", "2.11.0"], flash_attn: ["3.0.0"], '
        'cuda: ["13.0"], target: [H100]}\n'
        'entries: [{python: "3.12", torch: "2.11.0", flash_attn: "2.8.3", target: [H100]}]\n',
    )
    fa3_entries = [e for e in m.entries if e.generation.number == 3]
    assert len(fa3_entries) == 4 and {e.archs for e in fa3_entries} == {("90a",)}
    assert len({e.compile_group for e in fa3_entries}) == 1
    assert fa3_entries[0].compile_group == f"fa3.0.0-cu13.{fa3.Fa3Build(**TRIMMED).label()}-sm90a"
    assert fa3_entries[0].sdist_sha256 == m.compat.releases["flash_attn_3"]["3.0.0"].sha256
    (fa2,) = (e for e in m.entries if e.generation.number == 2)
    assert fa2.archs == ("90",) and fa2.generation is generations.FA2 and "fa3" not in fa2.summary()
    assert fa3_entries[0].summary()["fa3"]["build"] == "hdim 128; bf16,fp16; without split,paged_kv,sm80"


@pytest.mark.parametrize(
    ("entry", "fa3_yaml", "says"),
    [
        ('torch: "2.8.0", target: [H100]', "", "built on torch's stable ABI, from torch 2.9; not 2.8.0"),
        ('torch: "2.9.1", cuda: "12.6", target: [H100]', "", "downloads nvcc 12.6"),
        ('torch: "2.11.0", target: [B200]', "", "cannot run on B200 (compute capability 10.0)"),
        ('torch: "2.11.0", target: [A10G]', TRIMMED_YAML, "its sm_80 kernels are left out"),
        ('torch: "2.11.0", archs: [90]', "", "archs is not for FlashAttention-3"),
        ('torch: "2.11.0", target: [H100], flash_attn: "3.0.1"', "", "FlashAttention-3 3.0.1 is not in the compat"),
        ('torch: "2.11.0", target: [H100]', "fa3: {head_dims: [100]}\n", "head dims [100]"),
        ('torch: "2.11.0", target: [H100]', "fa3: {dtypes: bf16, sizes: 1}\n", "unknown key fa3.sizes"),
        ('torch: "2.11.0", target: [H100]', "fa3: {head_dims: [x]}\n", "fa3.head_dims must be a list of numbers"),
    ],
)
def test_an_fa3_entry_it_cannot_build_is_refused_with_its_reason(entry, fa3_yaml, says, tmp_path: Path) -> None:
    from fa_images.errors import ConfigError

    fa = "" if "flash_attn" in entry else 'flash_attn: "3.0.0", '
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, fa3_yaml + f'entries: [{{python: "3.12", {fa}{entry}}}]\n')
    assert says in str(caught.value)


def test_a_rule_leaves_out_the_torches_fa3_cannot_use_and_says_why(tmp_path: Path) -> None:
    m = load(tmp_path, 'matrix: {python: ["3.12"], torch: ">=2.8", flash_attn: ["3.0.0"], target: [H100]}\n')
    reasons = {o.combination: o.reason for o in m.left_out}
    assert any("torch=2.8.0" in c and "stable ABI" in r for c, r in reasons.items())
    assert all(e.torch != "2.8.0" for e in m.entries) and any(e.torch == "2.9.1" for e in m.entries)


def test_the_dockerfile_asks_the_builder_for_the_build_and_installs_what_fa3_needs(tmp_path: Path) -> None:
    from fa_images.outputs.render import render_entry

    m = load(
        tmp_path, TRIMMED_YAML + 'entries: [{python: "3.12", torch: "2.11.0", flash_attn: "3.0.0", target: H100}]\n'
    )
    (entry,) = m.entries
    for form in ("buildkit", "sdk"):
        text = render_entry(m, entry, builder=form)
        assert "--fa3-head-dims 128 --fa3-dtypes bf16,fp16 --fa3-without split,paged_kv,sm80 \\" in text
        assert "--archs" not in text and "--index-url https://pypi.org/simple \\\n      --archs" not in text
        assert " ninja==1.13.2 " in text  # FA3's wheel requires ninja; `pip check` holds it to that
        assert 'fa-images.generation="3"' in text and 'fa-images.fa3-build="hdim 128; bf16,fp16; without' in text


# --- one compile per group: the plan and the executor ---------------------------------------------


@pytest.fixture
def fa3_matrix(tmp_path: Path, monkeypatch):
    """Three FA3 entries of one compile group (two torches, two Pythons), the FA3 archive a tiny
    one laid out as `fa-images source fa3` lays it, pinned by a compat override."""
    from fa_images.config import matrix

    (tmp_path / "sdists").mkdir()
    archive = tmp_path / "sdists" / "flash_attn_3-3.0.0.tar.gz"
    top = "flash_attn_3-3.0.0"
    archive.write_bytes(
        _tar_gz(
            {
                f"{top}/hopper/setup.py": b"raise SystemExit('not run here')\n",
                f"{top}/hopper/__init__.py": b'__version__ = "3.0.0"\n',
                f"{top}/csrc/cutlass/include/cutlass/cutlass.h": b"#pragma once\n",
            }
        )
    )
    sha = source_mod.tar_sha256(archive)
    (tmp_path / "compat.yaml").write_text(
        f'flash_attn_3: {{"3.0.0": {{sha256: {sha}, flash_attention: {"a" * 40}, cutlass: {"b" * 40}}}}}\n'
    )
    (tmp_path / "matrix.yaml").write_text(
        "image: reg.local/fa\ncompat: compat.yaml\npackages: {sdists: sdists}\n" + TRIMMED_YAML
        + "entries:\n"
        '  - {python: "3.13", torch: "2.11.0", flash_attn: "3.0.0", target: [H100]}\n'
        '  - {python: "3.12", torch: "2.9.1", cuda: "13.0", flash_attn: "3.0.0", target: [H100]}\n'
        '  - {python: "3.12", torch: "2.11.0", flash_attn: "3.0.0", target: [H100]}\n'
    )  # fmt: skip
    monkeypatch.chdir(tmp_path)
    return matrix.load(tmp_path / "matrix.yaml")


def run_fa3(m, tmp_path: Path, engine=None, **plan_kw):
    import fakes

    from fa_images.run.executor import Options
    from fa_images.run.logger import Console

    out = io.StringIO()
    options = Options(dist=tmp_path / "dist", log_dir=tmp_path / "logs")
    engine = engine or fakes.FakeEngine()
    engine.nvcc = "13.0"  # the CUDA 13 devel base's
    plans, results = fakes.execute(m, engine, options, Console(out), **plan_kw)
    return plans, results, out.getvalue()


def test_the_oldest_torch_compiles_the_groups_wheel_once_and_the_others_share_it(fa3_matrix, tmp_path, monkeypatch):
    import fakes

    from fa_images.builder import dist

    fakes.accept_every_wheel(monkeypatch)
    engine = fakes.FakeEngine()
    plans, results, _out = run_fa3(fa3_matrix, tmp_path, engine)
    leader = "fa3.0.0-py3.12-torch2.9.1-cu130"
    assert plans[0].entry.id == leader  # moved first: the others wait for its wheel
    assert [p.shares_wheel_of for p in plans] == [None, leader, leader]
    assert all(contract.BUILDER_STAGE not in p.stages for p in plans[1:])
    assert [r.status for r in results] == ["ok"] * 3 and len({r.wheel for r in results}) == 1
    builds = [c for c in engine.calls if c[0] == "build"]
    assert sum(contract.BUILDER_STAGE in str(c) for c in engine.calls if c[0] == "before") == 0
    assert len(builds) == 3
    manifest = dist.read_manifest(tmp_path / "dist")
    assert [r.entry for r in manifest.wheels.values()] == [leader]  # the wheel once, recorded for its compile


def test_when_the_groups_compile_fails_the_entries_that_share_it_say_so(fa3_matrix, tmp_path, monkeypatch):
    import fakes

    fakes.accept_every_wheel(monkeypatch)
    engine = fakes.FakeEngine(fail_build={"py3.12-torch2.9.1"})
    _plans, results, _out = run_fa3(fa3_matrix, tmp_path, engine)
    assert [r.status for r in results] == ["failed"] * 3
    assert results[1].failed_step == "source" and "compiles the wheel this entry shares" in (results[1].error or "")


def test_a_later_run_of_one_entry_takes_the_groups_wheel_from_dist(fa3_matrix, tmp_path, monkeypatch):
    from fa_images.builder.source import sha256_of
    from fa_images.run import current

    def accept(path: Path, **_kw) -> verify.WheelReport:  # with the file's own sha256, which dist/ checks
        report = verify.WheelReport(wheel=path.name, sha256=sha256_of(path))
        report.add("fake", "pass", "accepted by the test")
        return report

    monkeypatch.setattr(verify, "inspect_wheel", accept)
    run_fa3(fa3_matrix, tmp_path, entries=fa3_matrix.entries[1:2])  # the group's compile only
    follower = fa3_matrix.entries[2]
    shared = current.shared_wheels(tmp_path / "dist", fa3_matrix.entries, (follower,))
    assert shared == {follower.id: (fa3_matrix.entries[1].id, shared[follower.id][1])}
    plans, results, _out = run_fa3(fa3_matrix, tmp_path, entries=(follower,), shared=shared)
    assert plans[0].prebuilt == shared[follower.id][1] and plans[0].shares_wheel_of == fa3_matrix.entries[1].id
    assert results[0].status == "ok" and contract.BUILDER_STAGE not in plans[0].stages
    assert "the group's, recorded for" in "\n".join(plans[0].describe())


# --- wheels given, and the build farms' scripts ---------------------------------------------------


def test_one_given_fa3_wheel_serves_its_group_and_enters_dist_once(fa3_matrix, tmp_path: Path) -> None:
    from fa_images.run import plan, prebuilt

    build_label = fa3.local_version_label("13.0", fa3.Fa3Build(**TRIMMED))
    wheel = fa3_wheel(tmp_path / "given", tag="cp310-abi3-manylinux_2_34_x86_64")
    named = wheel.with_name(wheel.name.replace("3.0.0+cu13", f"3.0.0+{build_label}"))
    wheel.rename(named)
    found = prebuilt.find(fa3_matrix.entries, [tmp_path / "given"])
    assert set(found.values()) == {named.resolve()} and len(found) == 3
    plans = plan.make_plan(fa3_matrix.entries, form="buildkit", compiler_cache=False, prebuilt=found)
    first = plans[0].entry.id
    assert [p.shares_wheel_of for p in plans] == [None, first, first]  # one of them puts it into dist/
    other = wheel.with_name(wheel.name.replace("3.0.0+cu13", "3.0.0+cu12"))
    named.rename(other)
    with pytest.raises(UsageError, match="no wheel for"):
        prebuilt.find(fa3_matrix.entries, [tmp_path / "given"])  # another CUDA major: not theirs


def test_the_farms_build_fa3_from_the_sources_folder_unsharded(fa3_matrix, tmp_path: Path) -> None:
    from fa_images.outputs.exports import builder_env, sharding, slurm

    entry = fa3_matrix.entries[0]
    fetch = builder_env.SdistFetch(index_url="https://pypi.org/simple", sources_dir="sdists")
    args = sharding.wheel_args(entry, compiler_cache="c", work_dir="w", fetch=fetch)
    assert args[:3] == ["wheel", "--flash-attn", "3.0.0"] and "--fa3-head-dims" in args
    assert "--archs" not in args and "--index-url" not in args and args[args.index("--sources-dir") + 1] == "sdists"
    with pytest.raises(UsageError, match="on no index"):
        sharding.wheel_args(
            entry,
            compiler_cache="c",
            work_dir="w",
            fetch=builder_env.SdistFetch(index_url="https://x/", sources_dir=None),
        )
    with pytest.raises(UsageError, match="built unsharded"):
        slurm.export(fa3_matrix, fa3_matrix.entries, tmp_path / "out", slurm.SlurmOptions(shards=2))


def test_a_generation_on_the_path_without_its_metadata_is_found(tmp_path: Path, monkeypatch) -> None:
    """A source tree on PYTHONPATH has no dist-info: its own module says which generation it is."""
    (tmp_path / "flash_attn_interface.py").write_text("# FA3's\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert gpucheck.installed() == [generations.FA3]
