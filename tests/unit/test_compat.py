"""The shipped compatibility table (fa_images/config/compat.yaml): it loads, its facts, its checks."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from unittest.mock import ANY

import pytest
import yaml
from packaging.version import Version

from fa_images.builder.source import SUPPORTED_FLASH_ATTN
from fa_images.config import compat as compat_mod
from fa_images.config.compat import Compat, did_you_mean
from fa_images.errors import ConfigError, Problem

SHIPPED = compat_mod.DEFAULT_FILE


@pytest.fixture(scope="module")
def table() -> Compat:
    return compat_mod.load()


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load(SHIPPED.read_text())


def override_problems(tmp_path: Path, text: str) -> list[Problem]:
    path = tmp_path / "compat-extra.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    with pytest.raises(ConfigError) as info:
        compat_mod.load(path)
    assert all(p.file == str(path) for p in info.value.problems)
    return info.value.problems


# ----------------------------------------------------------------------------- the shipped table


def test_shipped_table_loads(table: Compat) -> None:
    assert set(table.torch) >= {"2.5.1", "2.6.0", "2.7.0", "2.7.1", "2.8.0", "2.9.0", "2.9.1"}
    assert set(table.cuda) >= {"11.8", "12.4", "12.6", "12.8", "13.0"}
    assert set(table.archs) == {"80", "90", "100", "110", "120"}
    assert table.cuda13_min_torch == "2.9"


def test_shipped_table_has_only_known_sections(raw: dict) -> None:
    assert set(raw) == set(compat_mod.sections())


def test_torch_2_6_0_abi_depends_on_the_cuda_variant(table: Compat) -> None:
    release = table.torch["2.6.0"]
    assert release.variant("12.4").cxx11_abi is False
    assert release.variant("11.8").cxx11_abi is False
    assert release.variant("12.6").cxx11_abi is True  # the one new-ABI 2.6.0 variant
    assert release.default_cuda == "12.4"
    assert release.variant("12.8") is None


def test_new_abi_from_torch_2_7(table: Compat) -> None:
    for version, release in table.torch.items():
        if Version(version) >= Version("2.7"):
            assert all(v.cxx11_abi for v in release.variants), version
        elif version != "2.6.0":
            assert not any(v.cxx11_abi for v in release.variants), version


def test_torch_2_9_1_ships_cuda_13(table: Compat) -> None:
    release = table.torch["2.9.1"]
    assert [v.cuda for v in release.variants] == ["12.6", "12.8", "13.0"]
    assert release.variant("13.0").tag == "cu130"
    assert release.default_cuda == "12.8"
    assert table.cuda["13.0"].release == "13.0.1"


def test_torch_2_9_has_no_python_3_9(table: Compat) -> None:
    for version in ("2.9.0", "2.9.1"):
        assert "3.9" not in table.torch[version].pythons
        assert table.torch[version].pythons == ("3.10", "3.11", "3.12", "3.13", "3.14")
    assert "3.9" in table.torch["2.8.0"].pythons


def test_no_torch_before_2_9_has_a_cuda_13_variant(table: Compat) -> None:
    for version, release in table.torch.items():
        if Version(version) < Version(table.cuda13_min_torch):
            assert not any(v.cuda.startswith("13") for v in release.variants), version


def test_every_torch_variant_and_default_is_a_known_cuda(table: Compat) -> None:
    for version, release in table.torch.items():
        assert release.default_cuda in {v.cuda for v in release.variants}, version
        for variant in release.variants:
            assert variant.cuda in table.cuda, (version, variant.cuda)


def test_cuda_releases_belong_to_their_version(table: Compat) -> None:
    for version, release in table.cuda.items():
        assert release.version == version
        assert release.release.startswith(version + "."), version
        assert release.min_driver.isdigit()


@pytest.mark.parametrize(
    ("gpu", "capability", "arch"),
    [
        ("A10G", "8.6", "80"),
        ("a10g", "8.6", "80"),
        ("L4", "8.9", "80"),
        ("A100", "8.0", "80"),
        ("H100", "9.0", "90"),
        ("H200", "9.0", "90"),
        ("B200", "10.0", "100"),
        ("RTX5090", "12.0", "120"),
        ("RTX 4090", "8.9", "80"),  # spaces and dashes in the query are ignored
        ("sm_86", "8.6", "80"),
        ("SM89", "8.9", "80"),
        ("8.9", "8.9", "80"),
        ("sm_100", "10.0", "100"),
        ("sm_120", "12.0", "120"),
    ],
)
def test_gpu_to_arch(table: Compat, gpu: str, capability: str, arch: str) -> None:
    assert table.capability_of(gpu) == capability
    assert table.arch_for_capability(capability) == arch


@pytest.mark.parametrize(("gpu", "capability"), [("T4", "7.5"), ("V100", "7.0"), ("sm_75", "7.5")])
def test_pre_ampere_gpus_have_no_arch(table: Compat, gpu: str, capability: str) -> None:
    assert table.capability_of(gpu) == capability
    assert table.arch_for_capability(capability) is None


@pytest.mark.parametrize("gpu", ["H1000X", "", "sm_", "eight"])
def test_unknown_gpu(table: Compat, gpu: str) -> None:
    assert table.capability_of(gpu) is None


def test_arch_min_cuda(table: Compat) -> None:
    assert table.archs["80"] == ("11.7", "8")
    assert table.archs["90"] == ("11.8", "9")
    assert table.archs["100"] == ("12.8", "10")
    assert table.archs["120"] == ("12.8", "12")


def test_every_flash_attn_sha256_is_64_hex(table: Compat, raw: dict) -> None:
    assert set(table.flash_attn) == set(raw["flash_attn"])
    for version, release in table.flash_attn.items():
        assert re.fullmatch(r"[0-9a-f]{64}", release.sha256), version
        assert raw["flash_attn"][version]["sha256"] == release.sha256


def test_every_flash_attn_is_buildable(table: Compat) -> None:
    for version in table.flash_attn:
        assert Version(version) in SUPPORTED_FLASH_ATTN, version


def test_flash_attn_facts(table: Compat) -> None:
    assert table.flash_attn["2.8.3"].sha256 == "1e71dd64a9e0280e0447b8a0c2541bad4bf6ac65bdeaa2f90e51a9e57de0370d"
    assert table.flash_attn["2.6.3"].cuda_archs_env is False  # 2.6.x hard-codes 80 and 90
    assert table.flash_attn["2.8.3"].cuda_archs_env is True


# ----------------------------------------------------------------------------- overrides


def test_override_merges_key_by_key(tmp_path: Path) -> None:
    path = tmp_path / "extra.yaml"
    path.write_text(
        textwrap.dedent("""
        torch:
          "2.9.1":
            python: ["3.11", "3.12"]
        gpus:
          GB300: "10.3"
    """)
    )
    table = compat_mod.load(path)
    assert table.torch["2.9.1"].pythons == ("3.11", "3.12")  # a list replaces
    assert table.torch["2.9.1"].default_cuda == "12.8"  # siblings stay
    assert table.capability_of("gb300") == "10.3"
    assert table.arch_for_capability("10.3") == "100"
    assert table.capability_of("A10G") == "8.6"


def test_merge() -> None:
    base = {"a": {"x": 1, "y": [1]}, "b": 2}
    merged = compat_mod.merge(base, {"a": {"y": [2], "z": 3}, "c": 4})
    assert merged == {"a": {"x": 1, "y": [2], "z": 3}, "b": 2, "c": 4}
    assert base == {"a": {"x": 1, "y": [1]}, "b": 2}  # not modified


@pytest.mark.parametrize(
    ("text", "line", "message", "hint"),
    [
        pytest.param(
            '# new GPUs\ngpu:\n  GB300: "10.3"\n',
            2,
            "unknown section 'gpu'",
            "did you mean 'gpus'?",
            id="unknown section",
        ),
        pytest.param("gpus: [A100]\n", 1, "gpus must be a mapping", ANY, id="section not a mapping"),
        pytest.param(
            f'flash_attn:\n  "2.8.3": {{sha256: {"z" * 64}}}\n',
            2,
            "flash_attn.2.8.3.sha256 must be 64 hex digits",
            ANY,
            id="sha256 not hex",
        ),
    ],
)
def test_one_bad_override_is_one_problem(tmp_path: Path, text: str, line: int, message: str, hint: object) -> None:
    (p,) = override_problems(tmp_path, text)
    assert (p.line, p.message, p.hint) == (line, message, hint)


def test_all_compat_problems_are_reported_together(tmp_path: Path) -> None:
    problems = override_problems(
        tmp_path,
        """
        torch:
          "2.99.0":
            python: ["3.12"]
            default_cuda: "13.1"
            cuda:
              "13.0": {cxx11_abi: true}
        cuda:
          "13.1": {release: 13.1}
        flash_attn:
          "2.4.2": {sha256: "0000000000000000000000000000000000000000000000000000000000000000"}
        rules:
          cuda13_min_torch: 2.9
    """,
    )
    assert [(p.line, p.message) for p in problems] == [
        (8, "cuda.13.1.release: 13.1 must be a quoted string"),
        (4, "torch.2.99.0.default_cuda '13.1' is not one of its CUDA variants"),
        (10, f"flash-attn 2.4.2 is outside what the builder can build ({SUPPORTED_FLASH_ATTN})"),
        (12, "rules.cuda13_min_torch: 2.9 must be a quoted string"),
    ]


def test_missing_override_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        compat_mod.load(tmp_path / "nope.yaml")
    (p,) = info.value.problems
    assert (p.file, p.message) == (str(tmp_path / "nope.yaml"), "compat override not found")


@pytest.mark.parametrize("name", ["RTX PRO 6000", "A100-80GB"])
def test_gpu_names_with_spaces_or_dashes_in_the_table(tmp_path: Path, name: str) -> None:
    path = tmp_path / "extra.yaml"
    path.write_text(f'gpus:\n  "{name}": "12.0"\n')
    assert compat_mod.load(path).capability_of(name) == "12.0"


# ----------------------------------------------------------------------------- did_you_mean


def test_did_you_mean() -> None:
    assert did_you_mean("gpu", compat_mod.sections()) == "did you mean 'gpus'?"
    assert did_you_mean("zzz", ["a", "b"]) == "known: a, b"
    assert did_you_mean("2.9.2", ["2.9.1", "2.8.0"]) == "did you mean '2.9.1'?"


def test_targets_name_known_gpus(tmp_path: Path) -> None:
    assert compat_mod.load().targets["aws"] == ("A10G", "L4")
    (p,) = override_problems(tmp_path, "targets:\n  lab: [A100, Z9]\n")
    assert (p.line, p.message) == (2, "target 'lab' names GPUs the gpus section lacks: Z9")
    (p,) = override_problems(tmp_path, "targets:\n  lab: A100\n")
    assert p.message == "target 'lab' must be a non-empty list of GPU names"
