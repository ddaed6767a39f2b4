"""matrix.yaml -> frozen Entry objects: expansion, arch resolution, validation, overrides, CLI.

Every validation test asserts the message and the line it points at; most are rows of REFUSED,
a matrix and the problems it must be refused with.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple
from unittest.mock import ANY

import pytest
from packaging.version import Version

from fa_images.builder.source import SUPPORTED_FLASH_ATTN
from fa_images.config import compat as compat_mod
from fa_images.config import matrix as matrix_mod
from fa_images.config import yamlfile
from fa_images.config.matrix import Entry, Matrix
from fa_images.errors import ConfigError, Problem, UsageError
from fa_images.outputs import render

REPO = Path(__file__).resolve().parents[2]
ENTRY = '{python: "3.12", torch: "2.9.1", flash_attn: "2.8.3", target: A100}'

# What the default matrix.yaml must plan, in plan order: the matrix's combinations first
# (python-major product order, minus the exclude), then the one-off entry.
DEFAULT_PLAN = [
    ("fa2.8.3-py3.11-torch2.6.0-cu124", "3.11", "2.6.0", "12.4", ("80",), False),
    ("fa2.8.3-py3.12-torch2.6.0-cu124", "3.12", "2.6.0", "12.4", ("80",), False),
    ("fa2.8.3-py3.12-torch2.9.1-cu128", "3.12", "2.9.1", "12.8", ("80",), True),
    ("fa2.8.3-py3.10-torch2.9.1-cu128", "3.10", "2.9.1", "12.8", ("80", "90"), True),
]
FA_283_SHA256 = "1e71dd64a9e0280e0447b8a0c2541bad4bf6ac65bdeaa2f90e51a9e57de0370d"


# ----------------------------------------------------------------------------- helpers


def write(tmp_path: Path, text: str, name: str = "matrix.yaml") -> Path:
    """Writes dedented ``text``; its first non-empty line is line 1."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def load(tmp_path: Path, text: str, **kwargs) -> Matrix:
    return matrix_mod.load(write(tmp_path, text), **kwargs)


def problems_of(tmp_path: Path, text: str, **kwargs) -> list[Problem]:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text, **kwargs)
    return info.value.problems


def one_problem(tmp_path: Path, text: str, **kwargs) -> Problem:
    problems = problems_of(tmp_path, text, **kwargs)
    assert len(problems) == 1, "expected exactly one problem, got:\n" + "\n".join(map(str, problems))
    return problems[0]


def entry_of(tmp_path: Path, line: str, extra: str = "") -> Entry:
    """The one Entry of a matrix whose only content is ``entries: [line]``."""
    m = load(tmp_path, extra + f"entries:\n  - {line}\n")
    assert len(m.entries) == 1
    return m.entries[0]


def run_cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "fa_images", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


# ----------------------------------------------------------------------------- default matrix


@pytest.fixture(scope="module")
def default_matrix() -> Matrix:
    return matrix_mod.load(REPO / "matrix.yaml")


def test_default_matrix_plans_exactly_the_four_field_environments(default_matrix: Matrix) -> None:
    got = [(e.id, e.python, e.torch, e.cuda, e.archs, e.cxx11_abi) for e in default_matrix.entries]
    assert got == DEFAULT_PLAN


def test_default_matrix_entries_are_complete(default_matrix: Matrix) -> None:
    assert default_matrix.image == "ghcr.io/fa-images/flash-attn"
    for e in default_matrix.entries:
        assert e.id == f"fa{e.flash_attn}-py{e.python}-torch{e.torch}-{e.cuda_tag}"
        assert e.image == f"ghcr.io/fa-images/flash-attn:{e.id}"
        assert e.flash_attn == "2.8.3"
        assert e.sdist_sha256 == FA_283_SHA256
        assert e.ptx is False
        assert e.cuda_release == {"12.4": "12.4.1", "12.8": "12.8.1"}[e.cuda]
        assert e.devel_image == f"nvidia/cuda:{e.cuda_release}-devel-ubuntu22.04"
        assert e.runtime_image == f"nvidia/cuda:{e.cuda_release}-base-ubuntu22.04"
        assert e.torch_index == f"https://download.pytorch.org/whl/{e.cuda_tag}"


def test_default_matrix_gpus_come_from_named_targets(default_matrix: Matrix) -> None:
    gpus = {e.id: e.gpus for e in default_matrix.entries}
    assert gpus["fa2.8.3-py3.12-torch2.9.1-cu128"] == ("A10G", "L4")
    assert gpus["fa2.8.3-py3.10-torch2.9.1-cu128"] == ("A10G", "L4", "A100", "H100")


def test_entries_are_frozen(default_matrix: Matrix) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        default_matrix.entries[0].archs = ("90",)  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        default_matrix.image = "x"  # type: ignore[misc]
    assert isinstance(default_matrix.entries, tuple)


def test_summary_is_json_ready(default_matrix: Matrix) -> None:
    summary = default_matrix.entries[-1].summary()
    assert summary["archs"] == ["80", "90"]
    assert summary["gpus"] == ["A10G", "L4", "A100", "H100"]
    assert json.loads(json.dumps(summary)) == summary


# ----------------------------------------------------------------------------- expansion


def expand_values(data: dict) -> tuple[list[dict], list[Problem]]:
    problems: list[Problem] = []
    combos = matrix_mod.expand(yamlfile.YamlDoc(data=data, file="m.yaml"), problems)
    return [c.values for c in combos], problems


def test_expand_is_the_cartesian_product_in_axis_order() -> None:
    values, problems = expand_values(
        {"matrix": {"python": ["3.11", "3.12"], "torch": ["2.6.0", "2.9.1"], "ptx": [False]}}
    )
    assert problems == []
    assert values == [
        {"python": "3.11", "torch": "2.6.0", "ptx": False},
        {"python": "3.11", "torch": "2.9.1", "ptx": False},
        {"python": "3.12", "torch": "2.6.0", "ptx": False},
        {"python": "3.12", "torch": "2.9.1", "ptx": False},
    ]


def test_exclude_matches_partially() -> None:
    values, _ = expand_values(
        {
            "matrix": {
                "python": ["3.10", "3.11", "3.12"],
                "torch": ["2.6.0", "2.9.1"],
                "exclude": [{"torch": "2.6.0"}, {"python": "3.10", "torch": "2.9.1"}],
            }
        }
    )
    assert values == [{"python": "3.11", "torch": "2.9.1"}, {"python": "3.12", "torch": "2.9.1"}]


def test_include_merges_extra_keys_into_matching_combinations_only() -> None:
    values, _ = expand_values(
        {
            "matrix": {
                "python": ["3.11", "3.12"],
                "torch": ["2.6.0", "2.9.1"],
                "include": [{"torch": "2.9.1", "cuda": "12.8"}],
            }
        }
    )
    assert values == [
        {"python": "3.11", "torch": "2.6.0"},
        {"python": "3.11", "torch": "2.9.1", "cuda": "12.8"},
        {"python": "3.12", "torch": "2.6.0"},
        {"python": "3.12", "torch": "2.9.1", "cuda": "12.8"},
    ]


def test_include_that_would_overwrite_an_axis_value_adds_a_new_combination() -> None:
    values, _ = expand_values(
        {
            "matrix": {
                "python": ["3.12"],
                "torch": ["2.9.1"],
                "include": [{"python": "3.12", "torch": "2.8.0", "cuda": "12.9"}],
            }
        }
    )
    assert values == [
        {"python": "3.12", "torch": "2.9.1"},  # original value kept
        {"python": "3.12", "torch": "2.8.0", "cuda": "12.9"},  # new combination, nothing inherited
    ]


def test_include_with_only_new_keys_goes_into_every_combination() -> None:
    values, _ = expand_values({"matrix": {"python": ["3.11", "3.12"], "include": [{"ptx": True}]}})
    assert values == [{"python": "3.11", "ptx": True}, {"python": "3.12", "ptx": True}]


def test_added_values_can_be_overwritten_by_later_includes() -> None:
    values, _ = expand_values(
        {
            "matrix": {
                "python": ["3.12"],
                "torch": ["2.6.0", "2.9.1"],
                "include": [{"cuda": "12.6"}, {"torch": "2.9.1", "cuda": "12.8"}],
            }
        }
    )
    assert values == [
        {"python": "3.12", "torch": "2.6.0", "cuda": "12.6"},
        {"python": "3.12", "torch": "2.9.1", "cuda": "12.8"},
    ]


def test_includes_do_not_merge_into_combinations_added_by_includes() -> None:
    values, _ = expand_values(
        {
            "matrix": {
                "python": ["3.12"],
                "include": [{"python": "3.11", "torch": "2.6.0"}, {"python": "3.11", "cuda": "12.4"}],
            }
        }
    )
    assert values == [
        {"python": "3.12"},
        {"python": "3.11", "torch": "2.6.0"},
        {"python": "3.11", "cuda": "12.4"},
    ]


def test_exclude_runs_before_include() -> None:
    values, _ = expand_values(
        {
            "matrix": {
                "python": ["3.11", "3.12"],
                "exclude": [{"python": "3.11"}],
                "include": [{"python": "3.11", "torch": "2.6.0"}],
            }
        }
    )
    assert values == [{"python": "3.12"}, {"python": "3.11", "torch": "2.6.0"}]


def test_one_off_entries_come_after_the_matrix() -> None:
    values, _ = expand_values(
        {
            "matrix": {"python": ["3.12"], "include": [{"python": "3.9", "torch": "2.5.1"}]},
            "entries": [{"python": "3.10"}],
        }
    )
    assert values == [{"python": "3.12"}, {"python": "3.9", "torch": "2.5.1"}, {"python": "3.10"}]


def test_expansion_through_load_keeps_plan_order(tmp_path: Path) -> None:
    m = load(
        tmp_path,
        """
        matrix:
          python: ["3.11", "3.12"]
          torch: ["2.6.0", "2.9.1"]
          flash_attn: ["2.8.3"]
          target: [A100]
          exclude:
            - {python: "3.11", torch: "2.6.0"}
          include:
            - {cuda: "12.6"}
            - {torch: "2.9.1", cuda: "12.8"}
            - {python: "3.13", torch: "2.9.1", cuda: "13.0", flash_attn: "2.8.3", archs: [90]}
        entries:
          - {python: "3.10", torch: "2.8.0", flash_attn: "2.8.2", target: H100}
    """,
    )
    assert [e.id for e in m.entries] == [
        "fa2.8.3-py3.11-torch2.9.1-cu128",
        "fa2.8.3-py3.12-torch2.6.0-cu126",
        "fa2.8.3-py3.12-torch2.9.1-cu128",
        "fa2.8.3-py3.13-torch2.9.1-cu130",
        "fa2.8.2-py3.10-torch2.8.0-cu128",  # torch 2.8.0's default CUDA
    ]
    assert m.entries[1].cxx11_abi is True  # 2.6.0+cu126 is the one new-ABI 2.6.0 variant
    assert m.entries[3].archs == ("90",)


# ----------------------------------------------------------------------------- targets -> archs


@pytest.mark.parametrize(
    ("target", "archs"),
    [
        ("A10G", ("80",)),
        ("L4", ("80",)),
        ("a10g", ("80",)),  # case-insensitive
        ("A100", ("80",)),
        ("H100", ("90",)),
        ("H200", ("90",)),
        ('"sm_86"', ("80",)),
        ('"sm_89"', ("80",)),
        ('"8.9"', ("80",)),
        ("[A10G, L4]", ("80",)),
        ("[L4, H100]", ("80", "90")),
    ],
)
def test_target_resolves_to_archs(tmp_path: Path, target: str, archs: tuple[str, ...]) -> None:
    e = entry_of(tmp_path, f'{{python: "3.12", torch: "2.9.1", flash_attn: "2.8.3", target: {target}}}')
    assert e.archs == archs


def test_b200_needs_arch_100(tmp_path: Path) -> None:
    e = entry_of(tmp_path, '{python: "3.12", torch: "2.9.1", flash_attn: "2.8.3", target: [B200, H100, A10G]}')
    assert e.archs == ("80", "90", "100")  # sorted numerically, not as strings
    assert e.gpus == ("B200", "H100", "A10G")


def test_named_targets_are_the_union_of_their_gpus(tmp_path: Path) -> None:
    e = entry_of(
        tmp_path,
        '{python: "3.12", torch: "2.9.1", flash_attn: "2.8.3", target: [aws, cluster]}',
        extra="targets:\n  aws: [A10G, L4]\n  cluster: [A100, H100]\n",
    )
    assert e.archs == ("80", "90")
    assert e.gpus == ("A10G", "L4", "A100", "H100")


@pytest.mark.parametrize(
    ("fields", "gpus"),
    [
        ("archs: [80, 90], target: [H100, aws]", ("H100", "A10G", "L4")),  # more archs than needed is fine
        ("archs: [80], target: [A10G, L4, A100]", ("A10G", "L4", "A100")),  # sm_80 runs on 8.6 and 8.9
        ("archs: [100], target: B300", ("B300",)),  # 10.3 runs the sm_100 kernels
        ("archs: [80], ptx: true, target: [H100, A10G]", ("H100", "A10G")),  # sm_80 PTX runs on 9.0
    ],
)
def test_archs_and_target_that_agree_keep_both(tmp_path: Path, fields: str, gpus: tuple[str, ...]) -> None:
    e = entry_of(tmp_path, f'{{python: "3.12", torch: "2.9.1", cuda: "12.8", flash_attn: "2.8.3", {fields}}}')
    assert e.archs == tuple(sorted({a.strip() for a in fields.split("]")[0].split("[")[1].split(",")}, key=int))
    assert e.gpus == gpus


@pytest.mark.parametrize(
    ("archs", "capability", "ptx", "runs"),
    [
        (("80",), "8.0", False, True),
        (("80",), "8.6", False, True),
        (("80",), "8.9", False, True),
        (("80",), "9.0", False, False),
        (("90",), "8.9", False, False),
        (("90",), "8.9", True, False),  # PTX runs at or above its arch only
        (("80",), "9.0", True, True),
        (("80", "90"), "10.0", True, True),  # the newest arch's PTX
        (("80", "90"), "10.0", False, False),
        (("100",), "10.3", False, True),
        (("100",), "12.0", False, False),
        (("120",), "12.0", False, True),
    ],
)
def test_arch_runs_on_is_cudas_rule(archs: tuple[str, ...], capability: str, ptx: bool, runs: bool) -> None:
    assert compat_mod.arch_runs_on(archs, capability, ptx=ptx) is runs


@pytest.mark.parametrize(
    ("archs", "want"),
    [
        ("[80, 90]", ("80", "90")),
        ("[90, 80]", ("80", "90")),
        ('["sm_90", "8.0"]', ("80", "90")),
        ("80", ("80",)),
    ],
)
def test_explicit_archs(tmp_path: Path, archs: str, want: tuple[str, ...]) -> None:
    e = entry_of(tmp_path, f'{{python: "3.12", torch: "2.9.1", flash_attn: "2.8.3", archs: {archs}}}')
    assert e.archs == want
    assert e.gpus == ()


# ----------------------------------------------------------------------------- validation: files


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        matrix_mod.load(tmp_path / "nope.yaml")
    (p,) = info.value.problems
    assert (p.file, p.line, p.message) == (str(tmp_path / "nope.yaml"), None, "matrix file not found")
    out = f" --out {tmp_path / 'nope.yaml'}"
    assert p.hint == (
        f"`fa-images init{out}` writes a starter for this machine, `fa-images init --target aws{out}` one for "
        "AWS G5/G6; or pass --matrix FILE"
    )


def test_a_directory_is_not_a_matrix_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"is not a regular file \(a directory\); refusing to read it"):
        matrix_mod.load(tmp_path)


# ----------------------------------------------------------------------------- build options


def test_ptx_comes_from_build_options_unless_the_entry_says(tmp_path: Path) -> None:
    m = load(
        tmp_path,
        """
        build: {ptx: true}
        entries:
          - {python: "3.12", torch: "2.9.1", flash_attn: "2.8.3", archs: [80]}
          - {python: "3.11", torch: "2.9.1", flash_attn: "2.8.3", archs: [80], ptx: false}
    """,
    )
    assert [e.ptx for e in m.entries] == [True, False]
    assert m.build.ptx is True


# ----------------------------------------------------------------------------- validation: compat facts and names


def test_unknown_torch_lists_the_known_versions(tmp_path: Path) -> None:
    p = one_problem(
        tmp_path,
        """
        entries:
          - python: "3.12"
            torch: "2.3.1"
            cuda: "12.1"
            flash_attn: "2.8.3"
            target: A100
    """,
    )
    assert (p.line, p.message) == (3, "torch 2.3.1 is not in the compat table")
    known = ", ".join(compat_mod.load().torch)  # every release the table has, in its order
    assert p.hint == f"known: {known}; add it with --compat FILE, or set allow_unknown: true"


def test_arch_100_with_cuda_12_8_is_fine(tmp_path: Path) -> None:
    e = entry_of(tmp_path, '{python: "3.12", torch: "2.9.1", cuda: "12.8", flash_attn: "2.8.3", target: B200}')
    assert e.archs == ("100",)


@pytest.mark.parametrize(("key", "value"), [("flash_attn", "main"), ("torch", "nightly"), ("cuda", "12.x")])
def test_non_pep440_versions_are_config_errors(tmp_path: Path, key: str, value: str) -> None:
    fields = {"python": "3.12", "torch": "2.9.1", "cuda": "13.0", "flash_attn": "2.8.3"}
    fields[key] = value
    line = "{" + ", ".join(f'{k}: "{v}"' for k, v in fields.items()) + ", archs: [80]}"
    with pytest.raises(ConfigError) as info:
        load(tmp_path, f"entries:\n  - {line}\n")
    assert any(value in p.message for p in info.value.problems)


def test_allow_unknown_lets_an_unknown_torch_through(tmp_path: Path) -> None:
    m = load(
        tmp_path,
        """
        allow_unknown: true
        entries:
          - {python: "3.12", torch: "2.99.0", cuda: "12.8", flash_attn: "2.8.3", target: H100}
          - {python: "3.12", torch: "2.9.1", cuda: "12.8", flash_attn: "2.8.0", target: H100}
    """,
    )
    new_torch, new_fa = m.entries
    assert new_torch.id == "fa2.8.3-py3.12-torch2.99.0-cu128"
    assert new_torch.cxx11_abi is None  # the table does not know; the builder reads it from torch
    assert new_torch.sdist_sha256 == FA_283_SHA256
    assert new_torch.archs == ("90",)
    assert new_fa.cxx11_abi is True
    assert new_fa.sdist_sha256 is None  # unknown sdist: no sha256 to pin


def test_all_problems_are_reported_together(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        image: Acme/FA
        targts: {}
        matrix:
          python: ["3.12", 3.10]
          torch: ["2.9.1"]
          flash_attn: ["2.8.3"]
          target: [A100]
        entries:
          - {python: "3.12", torch: "2.6.0", cuda: "12.8", flash_attn: "2.8.3", target: A100}
          - {python: "3.9", torch: "2.9.1", flash_attn: "2.4.2", target: T4}
    """,
    )
    with pytest.raises(ConfigError) as info:
        matrix_mod.load(path)
    got = [(p.line, p.message) for p in info.value.problems]
    assert got == [
        (2, "unknown key 'targts'"),
        (
            1,
            "image 'Acme/FA' is not a repository name "
            "(lower case letters, digits, '.', '_', '-', '/', an optional registry host)",
        ),
        (4, "python 3.10 must be a quoted string"),
        (9, "torch 2.6.0 has no CUDA 12.8 build"),
        (10, "T4 (compute capability 7.5) cannot run flash-attn 2"),
        (10, "torch 2.9.1 has no wheels for Python 3.9"),
        (10, "flash-attn 2.4.2 cannot be built by fa-images"),
    ]
    text = str(info.value)
    assert text.startswith("7 problems found:\n")
    assert f"  {path}:10: entry entries[1]: flash-attn 2.4.2 cannot be built" in text
    assert isinstance(info.value, UsageError) and info.value.exit_code == 2


@pytest.mark.parametrize("image", ["acme/fa", "ghcr.io/acme/flash-attn", "localhost:5000/fa", "mirror.local/a/b_c/d-e"])
def test_good_image_names(tmp_path: Path, image: str) -> None:
    m = load(tmp_path, f'image: "{image}"\nentries:\n  - {ENTRY}\n')
    assert m.entries[0].image == f"{image}:fa2.8.3-py3.12-torch2.9.1-cu128"


def test_default_image(tmp_path: Path) -> None:
    assert entry_of(tmp_path, ENTRY).image == "fa-images/flash-attn:fa2.8.3-py3.12-torch2.9.1-cu128"


# ----------------------------------------------------------------------------- validation: refused matrices


@dataclass(frozen=True)
class Like:
    """A message pinned by its parts, where the whole text is not the point of the case."""

    start: str = ""
    end: str = ""
    holds: tuple[str, ...] = ()

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, str)
            and other.startswith(self.start)
            and other.endswith(self.end)
            and all(part in other for part in self.holds)
        )


class Want(NamedTuple):
    """One expected problem; ``ANY`` where a case does not pin a field."""

    line: int | None
    message: str | Like
    hint: Any = ANY
    entry: Any = ANY
    file: str = "matrix.yaml"  # under tmp_path
    shown: str | None = None  # the whole printed line, ``{file}`` standing for the file's path


def refused(case_id: str, text: str, *wants: Want, compat: str | None = None) -> Any:
    """A matrix (and a compat override) that load must refuse with exactly ``wants``, in order."""
    return pytest.param(text, list(wants), compat, id=case_id)


TORCH_2_9_1 = 'entries:\n  - python: "3.12"\n    torch: "2.9.1"\n    flash_attn: "2.8.3"\n'
RULE_HINT = 'e.g. torch: ">=2.9", torch: {newest: 2} or torch: {versions: ">=2.9", newest: 2}'
NEWEST = "matrix.torch.newest must be a whole number from 1 to 100,"


AMPERE_HINT = "flash-attn 2 needs Ampere (8.0) or newer"
IMAGE_RULE = "(lower case letters, digits, '.', '_', '-', '/', an optional registry host)"
IMAGE_HINT = "e.g. ghcr.io/acme/flash-attn (lower case, no tag: tags come from the entries)"


def torch_rule(rule: str) -> str:
    """A matrix whose torch axis, on line 2, is ``rule`` (YAML; a block mapping's keys from line 3)."""
    return f'matrix:\n  torch: {rule}\n  python: ["3.12"]\n  flash_attn: ["2.8.3"]\n  target: [A100]\n'


REFUSED = [
    # --- one entry built twice
    refused(
        "duplicate id: the entry that builds it first is named",
        """
        matrix:
          python: ["3.12"]
          torch: ["2.9.1"]
          flash_attn: ["2.8.3"]
          target: [A100]
        entries:
          - {python: "3.12", torch: "2.9.1", cuda: "12.8", flash_attn: "2.8.3", archs: [80]}
        """,
        Want(
            7,
            "expands to fa2.8.3-py3.12-torch2.9.1-cu128, which "
            "matrix[python=3.12, torch=2.9.1, flash_attn=2.8.3, target=A100] already builds",
            hint="remove one, or change an exclude/include rule",
            entry="entries[0]",
        ),
    ),
    refused(
        "targets of one GPU class collide (two classes are an entry each: test_fleet.py)",
        """
        matrix:
          python: ["3.12"]
          torch: ["2.9.1"]
          flash_attn: ["2.8.3"]
          target: [A100, A10G]
        """,
        Want(
            1,
            Like(
                holds=(
                    "expands to fa2.8.3-py3.12-torch2.9.1-cu128, which matrix[",
                    "target=A100] already builds: both are GPU class sm80",
                )
            ),
            hint="name GPUs of one class in one target value, e.g. target: [[g5, g6e], g7e]",
        ),
    ),
    # --- targets -> archs
    refused(
        "an explicit arch flash-attn has no kernels for",
        TORCH_2_9_1 + "    archs: [86]\n",
        Want(5, Like(start="'86' is not a flash-attn arch", holds=("8.6 and 8.9 GPUs run the 80 kernels",))),
    ),
    refused(
        "archs that do not cover the target: refused with the fix, never dropped (issue 30)",
        """
        matrix:
          python: ["3.12"]
          torch: ["2.9.1"]
          flash_attn: ["2.8.3"]
          archs: [80]
          target: [H100]
        """,
        Want(
            5,
            "archs [80] do not cover target H100 (sm_90)",
            hint="add 90 to archs, or drop archs to take the target's",
            entry="matrix[python=3.12, torch=2.9.1, flash_attn=2.8.3, archs=80, target=H100]",
        ),
    ),
    refused(
        "every GPU the archs miss is named, once, with every arch to add",
        TORCH_2_9_1 + "    archs: [80]\n    target: [L4, B200, H100, H200]\n",
        Want(
            5,
            "archs [80] do not cover target B200 (sm_100), H100 (sm_90), H200 (sm_90)",
            hint="add 90, 100 to archs, or drop archs to take the target's",
        ),
    ),
    refused(
        "an sm_90 cubin does not run on an 8.x GPU, and PTX runs only at or above its arch",
        TORCH_2_9_1 + "    archs: [90]\n    ptx: true\n    target: [A10G]\n",
        Want(
            5, "archs [90] do not cover target A10G (sm_86)", hint="add 80 to archs, or drop archs to take the target's"
        ),
    ),
    *[
        refused(
            f"pre-Ampere GPU {gpu}",
            TORCH_2_9_1 + f"    target: [A10G, {gpu}]\n",
            Want(5, Like(end="(compute capability 7.5) cannot run flash-attn 2"), hint=AMPERE_HINT),
        )
        for gpu in ("T4", '"sm_75"')
    ],
    refused(
        "an unknown GPU gets a did-you-mean",
        """
        targets:
          aws: [A10G, L4]
        entries:
          - python: "3.12"
            torch: "2.9.1"
            flash_attn: "2.8.3"
            target: H1000
        """,
        Want(
            7,
            "unknown GPU or target 'H1000'",
            hint="did you mean 'H100'?; or write its compute capability, e.g. sm_86",
            entry="entries[0]",
            shown="{file}:7: entry entries[0]: unknown GPU or target 'H1000' "
            "(did you mean 'H100'?; or write its compute capability, e.g. sm_86)",
        ),
    ),
    refused(
        "an unknown GPU inside a named target is reported at the target",
        f"""
        targets:
          lab: [A100, RTX4080]
        entries:
          - {ENTRY.replace("A100", "lab")}
        """,
        Want(4, "unknown GPU or target 'RTX4080'", hint=Like(start="did you mean 'RTX4090'?")),
    ),
    refused(
        "no target and no archs",
        'entries:\n  - {python: "3.12", torch: "2.9.1", flash_attn: "2.8.3"}\n',
        Want(
            2,
            "no target and no archs: name the GPUs it is for",
            hint="e.g. target: aws (a name under targets:) or archs: [80]",
        ),
    ),
    refused(
        "targets must map names to lists",
        f"""
        image: acme/fa
        targets:
          lab: A10G
        entries:
          - {ENTRY.replace("A100", "lab")}
        """,
        Want(3, "target 'lab' must be a non-empty list of GPU names"),
        Want(5, "unknown GPU or target 'lab'"),
    ),
    # --- files
    refused(
        "a YAML syntax error has its line and column",
        """
        image: acme/fa
        entries:
          - {python: "3.12", torch: "2.9.1"
          - {python: "3.11"}
        """,
        Want(
            4,
            "invalid YAML: did not find expected ',' or '}'",  # libyaml's words
            hint="column 3",
            shown="{file}:4: invalid YAML: did not find expected ',' or '}' (column 3)",
        ),
    ),
    refused(
        "tab indentation is a syntax error",
        "image: acme/fa\n\tentries: []\n",
        Want(2, "invalid YAML: found a tab character that violates indentation", hint="column 1"),
    ),
    *[
        refused(f"empty file {text!r}", text, Want(None, "matrix file is empty"))
        for text in ("", "\n\n", "# only a comment\n", "---\n")
    ],
    *[
        refused(f"top level is a {kind}", text, Want(1, f"matrix file must be a mapping at the top, not a {kind}"))
        for text, kind in (("- a\n- b\n", "list"), ("hello\n", "str"), ("3.10\n", "float"))
    ],
    refused(
        "an unknown top-level key gets a did-you-mean",
        f"""
        image: acme/fa
        entrys:
          - {ENTRY}
        entries:
          - {ENTRY}
        """,
        Want(2, "unknown key 'entrys'", hint="did you mean 'entries'?", entry=None),
    ),
    refused(
        "matrix must be a mapping",
        "image: acme/fa\nmatrix: [python]\n",
        Want(2, "matrix must be a mapping of axes, not a list (['python'])"),
    ),
    refused(
        "entries must be a list",
        "entries: {python: '3.12'}\n",
        Want(1, "entries must be a list of mappings, not a mapping ({'python': '3.12'})"),
    ),
    refused(
        "each entry must be a mapping",
        f"entries:\n  - {ENTRY}\n  - just-a-string\n",
        Want(3, "each entry must be a mapping"),
    ),
    refused(
        "a matrix that expands to nothing",
        """
        image: acme/fa
        matrix:
          python: ["3.12"]
          exclude:
            - {python: "3.12"}
        """,
        Want(2, "the matrix expands to no entries"),
    ),
    # --- axes and keys
    refused(
        "an unknown axis gets a did-you-mean, and the axis it dropped is missing",
        """
        matrix:
          pyton: ["3.12"]
          torch: ["2.9.1"]
          flash_attn: ["2.8.3"]
          target: [A100]
        """,
        Want(2, "unknown axis 'pyton'", hint="did you mean 'python'?"),
        Want(1, "python is missing"),
    ),
    refused(
        "an axis must be a non-empty list, or a rule where the table knows the versions",
        """
        matrix:
          python: 3.12
          torch: []
          flash_attn: ["2.8.3"]
          target: "A100"
        """,
        Want(
            2,
            "axis 'python' must be a non-empty list or a rule, not a number ('3.12')",
            hint='e.g. python: ["3.12"], python: ">=3.10" or python: {newest: 2}',
        ),
        Want(
            3,
            "axis 'torch' must be a non-empty list or a rule, not a list ([])",
            hint='e.g. torch: ["2.9.1"], torch: ">=2.9" or torch: {newest: 2}',
        ),
        Want(5, "axis 'target' must be a non-empty list, not the string 'A100'", hint="e.g. target: [aws]"),
        # What the dropped axes leave behind is reported too.
        Want(2, "python is missing"),
        Want(3, "torch is missing"),
        Want(1, "no target and no archs: name the GPUs it is for"),
    ),
    refused(
        "exclude and include rules are checked",
        """
        matrix:
          python: ["3.12"]
          torch: ["2.9.1"]
          flash_attn: ["2.8.3"]
          target: [A100]
          exclude:
            - {cuda: "12.8"}
            - just-a-string
          include:
            - 42
        """,
        Want(7, "exclude rule names 'cuda', which is not an axis", hint="known: python, torch, flash_attn, target"),
        Want(8, "each exclude rule must be a mapping", hint=None),
        Want(10, "each include rule must be a mapping", hint=None),
    ),
    refused(
        "an unknown key in an entry",
        TORCH_2_9_1 + "    target: A100\n    ptxx: true\n",
        Want(6, "unknown key 'ptxx'", hint="did you mean 'ptx'?", entry="entries[0]"),
    ),
    refused(
        "an unknown key in an include points at the include",
        """
        matrix:
          python: ["3.12"]
          torch: ["2.9.1"]
          flash_attn: ["2.8.3"]
          target: [A100]
          include:
            - {python: "3.11", torch: "2.9.1", flash_attn: "2.8.3", target: A100, cudaa: "12.8"}
        """,
        Want(7, "unknown key 'cudaa'", entry="matrix.include[0]"),
    ),
    refused(
        "an unquoted 3.10",
        """
        matrix:
          python: [3.10]
          torch: ["2.9.1"]
          flash_attn: ["2.8.3"]
          target: [A100]
        """,
        Want(
            2,
            "python 3.10 must be a quoted string",
            hint='write python: "3.10"; YAML reads an unquoted 3.10 as the number 3.1',
            entry="matrix[python=3.10, torch=2.9.1, flash_attn=2.8.3, target=A100]",
        ),
    ),
    refused(
        "an unquoted cuda",
        """
        entries:
          - python: "3.12"
            torch: "2.9.1"
            cuda: 12.8
            flash_attn: "2.8.3"
            target: A100
        """,
        Want(4, "cuda 12.8 must be a quoted string", hint='write cuda: "12.8"'),
    ),
    refused(
        "an unquoted cuda does not hide other problems",
        """
        entries:
          - python: "3.12"
            torch: "2.9.1"
            cuda: 12.8
            flash_attn: "2.4.2"
            target: T4
        """,
        Want(4, "cuda 12.8 must be a quoted string"),
        Want(6, "T4 (compute capability 7.5) cannot run flash-attn 2"),
        Want(5, "flash-attn 2.4.2 cannot be built by fa-images"),
    ),
    refused(
        "missing version keys",
        "entries:\n  - {target: A100}\n",
        Want(2, "python is missing"),
        Want(2, "torch is missing"),
        Want(2, "flash_attn is missing"),
    ),
    refused(
        "a Python fa-images does not support",
        f"entries:\n  - {ENTRY.replace('3.12', '3.8')}\n",
        Want(2, "Python 3.8 is not supported", hint="use one of 3.9, 3.10, 3.11, 3.12, 3.13, 3.14"),
        Want(2, "torch 2.9.1 has no wheels for Python 3.8", hint="torch 2.9.1 supports 3.10, 3.11, 3.12, 3.13, 3.14"),
    ),
    refused(
        "ptx must be a bool",
        """
        entries:
          - {python: "3.12", torch: "2.9.1", flash_attn: "2.8.3", archs: [80],
             ptx: "yes"}
        """,
        Want(3, "ptx must be true or false, not 'yes'"),
    ),
    # --- compat facts
    refused(
        "a Python that torch does not support",
        """
        entries:
          - python: "3.9"
            torch: "2.9.1"
            flash_attn: "2.8.3"
            target: A100
        """,
        Want(2, "torch 2.9.1 has no wheels for Python 3.9", hint="torch 2.9.1 supports 3.10, 3.11, 3.12, 3.13, 3.14"),
    ),
    refused(
        "a CUDA variant torch does not have",
        """
        entries:
          - python: "3.12"
            torch: "2.9.1"
            cuda: "12.4"
            flash_attn: "2.8.3"
            target: A100
        """,
        Want(4, "torch 2.9.1 has no CUDA 12.4 build", hint="its variants: 12.6, 12.8, 13.0"),
    ),
    refused(
        "a missing CUDA variant from an include points at the include",
        """
        matrix:
          python: ["3.12"]
          torch: ["2.6.0"]
          flash_attn: ["2.8.3"]
          target: [A100]
          include:
            - {torch: "2.6.0", cuda: "12.8"}
        """,
        Want(7, "torch 2.6.0 has no CUDA 12.8 build"),
    ),
    refused(
        "CUDA 13 needs torch 2.9",
        """
        entries:
          - python: "3.12"
            torch: "2.8.0"
            cuda: "13.0"
            flash_attn: "2.8.3"
            target: A100
        """,
        Want(4, "torch 2.8.0 has no CUDA 13.0 build"),
        Want(4, "CUDA 13.0 needs torch >= 2.9, not 2.8.0"),
    ),
    refused(
        "the CUDA 13 rule holds even where the table has the variant",
        """
        entries:
          - python: "3.12"
            torch: "2.8.0"
            cuda: "13.0"
            flash_attn: "2.8.3"
            target: A100
        """,
        Want(4, "CUDA 13.0 needs torch >= 2.9, not 2.8.0"),
        compat="""
        torch:
          "2.8.0":
            cuda:
              "13.0": {cxx11_abi: true}
        """,
    ),
    *[
        refused(
            f"arch 100 needs CUDA 12.8 ({where})",
            'entries:\n  - python: "3.12"\n    torch: "2.6.0"\n    cuda: "12.4"\n    flash_attn: "2.8.3"\n'
            f"    {where}\n",
            Want(6, "arch 100 needs CUDA >= 12.8, this entry uses 12.4"),  # line 6: where the target or archs is
        )
        for where in ("target: B200", 'target: "sm_100"', "archs: [100]")
    ],
    refused(
        "arch 110 needs CUDA 13",
        'entries:\n  - python: "3.12"\n    torch: "2.6.0"\n    cuda: "12.4"\n    flash_attn: "2.8.3"\n'
        "    archs: [110]\n",
        Want(6, "arch 110 needs CUDA >= 13.0, this entry uses 12.4"),
    ),
    *[
        refused(
            f"flash-attn {version} is outside the supported range",
            f'entries:\n  - python: "3.12"\n    torch: "2.9.1"\n    flash_attn: "{version}"\n    target: A100\n',
            Want(4, f"flash-attn {version} cannot be built by fa-images", hint=f"supported: {SUPPORTED_FLASH_ATTN}"),
        )
        for version in ("2.4.2", "2.8.4", "2.9.0b1")
    ],
    refused(
        "an unknown flash-attn version inside the range",
        'entries:\n  - python: "3.12"\n    torch: "2.9.1"\n    flash_attn: "2.7.0"\n    target: A100\n',
        Want(
            4,
            "flash-attn 2.7.0 is not in the compat table",
            hint=Like(
                start="known: 2.5.9.post1, 2.6.3, ", end="; add it with --compat FILE, or set allow_unknown: true"
            ),
        ),
    ),
    refused(
        "allow_unknown still needs cuda for an unknown torch",
        """
        allow_unknown: true
        entries:
          - python: "3.12"
            torch: "2.99.0"
            flash_attn: "2.8.3"
            target: H100
        """,
        Want(3, "torch 2.99.0 is not in the compat table, so cuda must be given"),
    ),
    refused(
        "allow_unknown does not relax the flash-attn range",
        'allow_unknown: true\nentries:\n  - {python: "3.12", torch: "2.9.1", flash_attn: "2.4.2", target: H100}\n',
        Want(3, "flash-attn 2.4.2 cannot be built by fa-images"),
    ),
    refused(
        "an axis value wrong in many combinations is reported once",
        """
        matrix:
          python: ["3.11", "3.12"]
          torch: ["2.9.1"]
          flash_attn: ["2.4.2"]
          target: [A100]
        """,
        Want(
            4,
            "flash-attn 2.4.2 cannot be built by fa-images",
            entry="matrix[python=3.11, torch=2.9.1, flash_attn=2.4.2, target=A100] (and 1 more)",
        ),
    ),
    refused(
        "a bad cxx11_abi in an override is one problem",
        f"entries:\n  - {ENTRY}\n",
        Want(6, ANY, file="compat-extra.yaml"),
        compat="""
        torch:
          "2.99.0":
            python: ["3.12"]
            default_cuda: "12.8"
            cuda:
              "12.8": {cxx11_abi: "yes"}
        """,
    ),
    # --- the settings sections
    *[
        refused(
            f"bad image name {image!r}",
            f'image: "{image}"\nentries:\n  - {ENTRY}\n',
            Want(1, f"image {image!r} is not a repository name {IMAGE_RULE}", hint=IMAGE_HINT),
        )
        for image in ("Acme/FA", "acme/fa:latest", "acme//fa", "-acme/fa", "acme/fa/", "")
    ],
    refused(
        "bases.python must be uv or system",
        f"bases:\n  python: conda\nentries:\n  - {ENTRY}\n",
        Want(2, "bases.python must be uv or system, not 'conda'"),
    ),
    *[
        refused(
            f"unknown key {section}.{key}",
            f"{section}:\n  {key}: x\nentries:\n  - {ENTRY}\n",
            Want(2, f"unknown key {section}.{key}", hint=f"did you mean {near!r}?"),
        )
        for section, key, near in (
            ("bases", "devl", "devel"),
            ("packages", "torch-index", "torch_index"),
            ("build", "ptxx", "ptx"),
        )
    ],
    refused(
        "a section must be a mapping",
        f"packages: [a]\nentries:\n  - {ENTRY}\n",
        Want(1, "packages must be a mapping, not a list (['a'])"),
    ),
    refused(
        "an unknown placeholder in a base image",
        f'bases:\n  devel: "mirror/cuda:{{cuda_version}}-devel"\nentries:\n  - {ENTRY}\n',
        Want(2, Like(holds=("cuda_version",))),
    ),
    # --- versions by rule (issue 29): every bad rule is one problem, at its key, naming its path
    *[
        refused(f"a torch rule: {case}", torch_rule(rule), Want(line, message, hint=hint))
        for case, rule, line, message, hint in [
            (
                "not a specifier",
                '"=>2.9"',
                2,
                "matrix.torch '=>2.9' is not a version specifier",
                'a PEP 440 specifier such as ">=2.9", ">=2.9,<2.12" or "==2.9.*"',
            ),
            (
                "one version where a rule goes",
                '"2.9.1"',
                2,
                "matrix.torch '2.9.1' is not a version specifier",
                'one version is a list of one: torch: ["2.9.1"]; or "==2.9.1"',
            ),
            (
                "a control character is shown escaped",
                '">=2.9\\e[2J"',
                2,
                "matrix.torch '>=2.9\\x1b[2J' is not a version specifier",
                ANY,
            ),
            (
                "an empty specifier",
                '""',
                2,
                "matrix.torch is an empty specifier, which would take every release",
                RULE_HINT,
            ),
            ("an empty rule", "{}", 2, "matrix.torch is an empty rule", RULE_HINT),
            (
                "a specifier too long to be one",
                '"' + ">=2.9," * 40 + '"',
                2,
                "matrix.torch is a specifier of 240 characters; at most 200",
                None,
            ),
            ("newest: 0", "\n    newest: 0", 3, f"{NEWEST} not a number (0)", None),
            ("newest: 10**9", "\n    newest: 1000000000", 3, f"{NEWEST} not a number (1000000000)", None),
            ("newest: 10**40", "\n    newest: 1" + "0" * 40, 3, f"{NEWEST} not a number too large", None),
            ("newest: -1", "\n    newest: -1", 3, f"{NEWEST} not a number (-1)", None),
            ("newest: true", "\n    newest: true", 3, f"{NEWEST} not a boolean (True)", None),
            ("newest: a string", '\n    newest: "3"', 3, f"{NEWEST} not the string '3'", None),
            ("newest: a fraction", "\n    newest: 2.5", 3, f"{NEWEST} not a number ('2.5')", None),
            ("newest: a list", "\n    newest: [3]", 3, f"{NEWEST} not a list ([3])", None),
            ("newest: null", "\n    newest: null", 3, f"{NEWEST} not null", None),
            (
                "a misspelt key",
                "\n    neweset: 3",
                3,
                "unknown key 'neweset' in matrix.torch",
                "did you mean 'newest'?",
            ),
            (
                "versions that are no string",
                "\n    versions: 2.9\n    newest: 2",
                3,
                "matrix.torch.versions must be a quoted version specifier, not a number ('2.9')",
                RULE_HINT,
            ),
            (
                "a specifier no release of the table meets",
                '">=99"',
                2,
                'matrix.torch ">=99" matches no torch release of the compat table',
                Like(start="it knows 2.4.0, 2.4.1, 2.5.0, ", holds=(", 2.9.1, 2.10.0, ",)),
            ),
            (
                "an empty resolution of both keys",
                '\n    versions: "<2.0"\n    newest: 2',
                2,
                'matrix.torch {versions: "<2.0", newest: 2} matches no torch release of the compat table',
                ANY,
            ),
        ]
    ],
    refused(
        "a rule on each other axis the table knows, each matching nothing: one problem each",
        """
        matrix:
          python: ">=4"
          torch: ["2.9.1"]
          cuda: {versions: ">=14", newest: 1}
          flash_attn: "<2.0"
          target: [A100]
        """,
        Want(2, 'matrix.python ">=4" matches no Python of the compat table', hint=Like(start="it knows 3.9, 3.10,")),
        Want(
            4,
            'matrix.cuda {versions: ">=14", newest: 1} matches no CUDA version of the compat table',
            hint=Like(start="it knows 11.8, 12.1,"),
        ),
        Want(5, 'matrix.flash_attn "<2.0" matches no flash-attn release of the compat table', hint=ANY),
    ),
    refused(
        "a rule goes on a version axis only",
        """
        matrix:
          python: ["3.12"]
          torch: ["2.9.1"]
          flash_attn: ["2.8.3"]
          archs: ">=80"
        """,
        Want(5, "axis 'archs' must be a non-empty list, not the string '>=80'", hint="e.g. archs: [80]"),
        Want(1, "no target and no archs: name the GPUs it is for"),
    ),
    refused(
        "a rule names a matrix axis's versions, not one entry's",
        'entries:\n  - {python: "3.12", torch: {newest: 1}, flash_attn: "2.8.3", target: A100}\n',
        Want(
            2,
            "torch must be one quoted version here, not a mapping ({'newest': 1})",
            hint="a rule ({newest: N}, a specifier) names the versions of a matrix axis, not of one entry",
        ),
    ),
    refused(
        "a combination written by hand is refused, though another axis is a rule",
        """
        matrix:
          python: ["3.9"]
          torch: ["2.9.1"]
          flash_attn: {newest: 1}
          target: [A100]
        """,
        Want(2, "torch 2.9.1 has no wheels for Python 3.9", hint=Like(start="torch 2.9.1 supports 3.10, ")),
    ),
    refused(
        "a CUDA written by hand that the table does not know is a mistake, not a build a rule lacks",
        """
        matrix:
          python: ["3.12"]
          torch: {newest: 1}
          cuda: ["12.7"]
          flash_attn: ["2.8.3"]
          target: [A100]
        """,
        Want(4, Like(start="torch 2.", end=" has no CUDA 12.7 build")),
        Want(4, Like(start="CUDA 12.7 is not in the compat table")),
    ),
    refused(
        "a rule whose every combination the table has no build of",
        """
        matrix:
          python: ["3.9"]
          torch: {versions: ">=2.9,<2.11", newest: 2}
          flash_attn: ["2.8.3"]
          target: [A100]
        """,
        Want(
            1,
            "the matrix expands to no entries: the compat table has no build of its 2 combinations",
            hint="matrix[python=3.9, torch=2.9.1, flash_attn=2.8.3, target=A100]: "
            "torch 2.9.1 has no wheels for Python 3.9, and 1 more",
        ),
    ),
]


@pytest.mark.parametrize(("text", "wants", "compat"), REFUSED)
def test_a_refused_matrix_names_every_problem_where_it_is(
    tmp_path: Path, text: str, wants: list[Want], compat: str | None
) -> None:
    override = write(tmp_path, compat, name="compat-extra.yaml") if compat else None
    problems = problems_of(tmp_path, text, compat_override=override)
    got = [(p.file, p.line, p.message, p.hint, p.entry) for p in problems]
    assert got == [(str(tmp_path / w.file), w.line, w.message, w.hint, w.entry) for w in wants]
    for p, w in zip(problems, wants):
        if w.shown is not None:
            assert str(p) == w.shown.replace("{file}", str(tmp_path / w.file))


# ----------------------------------------------------------------------------- versions by rule


# Two torch releases newer than any the table will hold, and a release candidate newer still:
# what a rule resolves to is pinned whatever `compat refresh` adds to the built-in table.
FUTURE_TORCH = """
torch:
  "9.0.0": {python: ["3.12", "3.13"], default_cuda: "13.0", cuda: {"13.0": {cxx11_abi: true}}}
  "9.1.0": {python: ["3.13"], default_cuda: "13.0", cuda: {"13.0": {cxx11_abi: true}}}
  "9.2.0rc1": {python: ["3.12", "3.13"], default_cuda: "13.0", cuda: {"13.0": {cxx11_abi: true}}}
"""


def ruled_plan(m: Matrix) -> tuple[list[tuple[str | None, int | None, tuple[str, ...]]], list[str], list[str]]:
    """(each rule and its values, the ids planned, each left-out combination and its reason)."""
    rules = [(r.versions, r.newest, r.values) for r in m.rules]
    return rules, [e.id for e in m.entries], [f"{lo.combination}: {lo.reason}" for lo in m.left_out]


def test_a_specifier_takes_the_tables_releases_in_version_order(tmp_path: Path) -> None:
    m = load(
        tmp_path,
        'matrix:\n  python: ["3.12"]\n  torch: ">=2.9,<2.11"\n  flash_attn: ["2.8.3"]\n  target: [A100]\n',
    )
    (rule,) = m.rules
    assert (rule.axis, str(rule), rule.values) == ("torch", '">=2.9,<2.11"', ("2.9.0", "2.9.1", "2.10.0"))
    assert [e.id for e in m.entries] == [  # 2.10.0 after 2.9.1: versions, not strings
        "fa2.8.3-py3.12-torch2.9.1-cu128",
        "fa2.8.3-py3.12-torch2.10.0-cu128",
    ]
    # One wheel per torch series (torch2.9 in its name): the newest release of the series stays.
    assert [(lo.combination, lo.reason) for lo in m.left_out] == [
        (
            "matrix[python=3.12, torch=2.9.0, flash_attn=2.8.3, target=A100]",
            "torch 2.9.1 is newer in the 2.9 series, and one wheel serves a series",
        )
    ]


def test_two_torch_releases_of_one_series_written_by_hand_are_refused(tmp_path: Path) -> None:
    """They would make one wheel name, and dist/ holds one file of a name: the second entry's
    export would fail after its compile, and a published wheel is never replaced."""
    text = 'matrix:\n  python: ["3.12"]\n  torch: ["2.9.0", "2.9.1"]\n  flash_attn: ["2.8.3"]\n  target: [A100]\n'
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text)
    assert (
        "fa2.8.3-py3.12-torch2.9.0-cu128 and fa2.8.3-py3.12-torch2.9.1-cu128 would make the same wheel: flash-attn "
        "names a wheel by its torch series (torch2.9)"
    ) in str(caught.value)
    # Another CUDA, Python or flash-attn is another name: each stays.
    other = text.replace('["2.9.0", "2.9.1"]', '["2.9.1"]').replace('["3.12"]', '["3.11", "3.12"]')
    assert len(load(tmp_path, other).entries) == 2


def test_newest_torch_counts_series_one_wheel_each(tmp_path: Path) -> None:
    """Issue 43: {newest: 3} resolved to 2.14.0, 2.14.1, 2.15.0, then dropped 2.14.0: two wheels."""
    text = 'matrix:\n  python: ["3.12"]\n  torch: {newest: 3}\n  flash_attn: ["2.8.3"]\n  target: [A100]\n'
    m = load(tmp_path, text)
    series = sorted({".".join(v.split(".")[:2]) for v in m.compat.torch if not Version(v).is_prerelease}, key=Version)
    assert [".".join(v.split(".")[:2]) for v in m.rules[0].values] == series[-3:]
    assert len(m.entries) == 3 and not m.left_out
    for value in m.rules[0].values:  # each the newest release of its series
        same = [v for v in m.compat.torch if v.startswith(value.rsplit(".", 1)[0] + ".")]
        assert value == max(same, key=Version)
    python = load(tmp_path, text.replace("torch: {newest: 3}", 'torch: ["2.9.1"]').replace('["3.12"]', "{newest: 2}"))
    assert len(python.rules[0].values) == 2  # the other axes count releases


def test_newest_takes_the_newest_releases_and_never_a_pre_release(tmp_path: Path) -> None:
    override = write(tmp_path, FUTURE_TORCH, name="compat-extra.yaml")
    text = 'matrix:\n  python: ["3.13"]\n  torch: {rule}\n  flash_attn: ["2.8.3"]\n  target: [H100]\n'
    m = load(tmp_path, text.format(rule="{newest: 2}"), compat_override=override)
    assert ruled_plan(m) == (
        [(None, 2, ("9.0.0", "9.1.0"))],
        ["fa2.8.3-py3.13-torch9.0.0-cu130", "fa2.8.3-py3.13-torch9.1.0-cu130"],
        [],
    )
    assert str(m.rules[0]) == "{newest: 2}"
    # Both keys: the newest of what the specifier admits; a specifier that names a pre-release admits it.
    m = load(tmp_path, text.format(rule='{versions: "<9", newest: 1}'), compat_override=override)
    assert m.rules[0].values == (max((v for v in m.compat.torch if v[0] != "9"), key=Version),)
    assert str(m.rules[0]) == '{versions: "<9", newest: 1}'
    m = load(tmp_path, text.format(rule='">=9.1.0rc1"'), compat_override=override)
    assert m.rules[0].values == ("9.1.0", "9.2.0rc1")


def test_rules_leave_out_what_the_table_has_no_build_of_and_say_why(tmp_path: Path) -> None:
    """Python and CUDA by rule, torch by hand: each combination the table lacks is left out, with its reason."""
    m = load(
        tmp_path,
        """
        matrix:
          python: ">=3.13"
          torch: ["2.8.0", "2.9.1"]
          cuda: ">=12.9,<13.1"
          flash_attn: ["2.8.3"]
          target: [A100]
        """,
    )
    rules, ids, left_out = ruled_plan(m)
    assert rules == [(">=3.13", None, ("3.13", "3.14")), (">=12.9,<13.1", None, ("12.9", "13.0"))]
    assert ids == [
        "fa2.8.3-py3.13-torch2.8.0-cu129",
        "fa2.8.3-py3.13-torch2.9.1-cu130",
        "fa2.8.3-py3.14-torch2.9.1-cu130",
    ]
    label = "matrix[python={}, torch={}, cuda={}, flash_attn=2.8.3, target=A100]: "
    assert left_out == [
        label.format("3.13", "2.8.0", "13.0") + "torch 2.8.0 has no CUDA 13.0 build",
        label.format("3.13", "2.9.1", "12.9") + "torch 2.9.1 has no CUDA 12.9 build",
        label.format("3.14", "2.8.0", "12.9") + "torch 2.8.0 has no wheels for Python 3.14",
        label.format("3.14", "2.8.0", "13.0") + "torch 2.8.0 has no wheels for Python 3.14",
        label.format("3.14", "2.9.1", "12.9") + "torch 2.9.1 has no CUDA 12.9 build",
    ]


def test_a_cuda_chosen_by_rule_that_cannot_compile_an_arch_is_left_out(tmp_path: Path) -> None:
    """B200 needs arch 100, which needs CUDA 12.8: a CUDA of a rule, or the default CUDA of a torch
    of a rule, that is older is left out; the target's other GPU keeps its entry."""
    m = load(
        tmp_path,
        """
        matrix:
          python: ["3.12"]
          torch: ">=2.5,<2.6"
          flash_attn: ["2.8.3"]
          target: [B200, H100]
        entries:
          - {python: "3.12", torch: "2.9.1", cuda: "12.8", flash_attn: "2.8.3", target: B200}
        """,
    )
    _, ids, left_out = ruled_plan(m)
    assert ids == ["fa2.8.3-py3.12-torch2.5.1-cu124", "fa2.8.3-py3.12-torch2.9.1-cu128"]
    assert [e.gpus for e in m.entries] == [("H100",), ("B200",)]
    assert left_out == [
        f"matrix[python=3.12, torch={t}, flash_attn=2.8.3, target=B200]: arch 100 needs CUDA >= 12.8, not 12.4"
        for t in ("2.5.0", "2.5.1")
    ] + [
        "matrix[python=3.12, torch=2.5.0, flash_attn=2.8.3, target=H100]: "
        "torch 2.5.1 is newer in the 2.5 series, and one wheel serves a series"
    ]
    m = load(
        tmp_path,
        'matrix:\n  python: ["3.12"]\n  torch: ["2.9.1"]\n  cuda: ">=12.6,<13"\n  flash_attn: ["2.8.3"]\n'
        "  target: [B200]\n",
    )
    _, ids, left_out = ruled_plan(m)
    assert ids == ["fa2.8.3-py3.12-torch2.9.1-cu128"]
    assert [reason.split(": ", 1)[1] for reason in left_out] == [
        "arch 100 needs CUDA >= 12.8, not 12.6",
        "torch 2.9.1 has no CUDA 12.9 build",
    ]


def test_exclude_and_include_match_what_a_rule_resolved_to(tmp_path: Path) -> None:
    m = load(
        tmp_path,
        """
        matrix:
          python: ["3.12"]
          torch: ">=2.9,<2.10"
          flash_attn: ["2.8.3"]
          target: [A100]
          exclude: [{torch: "2.9.0"}]
          include: [{torch: "2.9.1", cuda: "13.0"}]
        """,
    )
    assert [e.id for e in m.entries] == ["fa2.8.3-py3.12-torch2.9.1-cu130"]


def test_what_a_rule_renders_changes_only_with_the_table(tmp_path: Path) -> None:
    """render --check on a rule: up to date for the table it was rendered with; a release the table
    gains is a new Dockerfile, one it drops a file no entry renders."""
    override = write(tmp_path, FUTURE_TORCH, name="compat-extra.yaml")
    text = 'matrix:\n  python: ["3.13"]\n  torch: {newest: 1}\n  flash_attn: ["2.8.3"]\n  target: [H100]\n'
    out = tmp_path / "dockerfiles"
    before = load(tmp_path, text)
    assert [p.name for p in render.render_all(before, before.entries, out, builder="sdk").written] == [
        f"{before.entries[0].id}.Dockerfile"
    ]
    again = load(tmp_path, text)
    assert render.render_all(again, again.entries, out, check=True, builder="sdk") == render.RenderResult(
        written=(), stale=(), extra=()
    )
    grown = load(tmp_path, text, compat_override=override)
    result = render.render_all(grown, grown.entries, out, check=True, builder="sdk")
    assert [p.name for p in result.stale] == ["fa2.8.3-py3.13-torch9.1.0-cu130.Dockerfile"]
    assert [p.name for p in result.extra] == [f"{before.entries[0].id}.Dockerfile"]


# ----------------------------------------------------------------------------- overrides


def test_bases_devel_points_at_a_registry_mirror(tmp_path: Path) -> None:
    m = load(
        tmp_path,
        f"""
        bases:
          devel: "mirror.local/nvidia/cuda:{{cuda_release}}-devel-ubuntu22.04"
          runtime: "mirror.local/nvidia/cuda:{{cuda}}-base"
        entries:
          - {ENTRY}
    """,
    )
    (e,) = m.entries
    assert e.devel_image == "mirror.local/nvidia/cuda:12.8.1-devel-ubuntu22.04"
    assert e.runtime_image == "mirror.local/nvidia/cuda:12.8-base"
    text = render.render_entry(m, e, builder="sdk")
    assert "FROM mirror.local/nvidia/cuda:12.8.1-devel-ubuntu22.04 AS builder\n" in text
    assert "FROM mirror.local/nvidia/cuda:12.8-base AS python\n" in text


def test_offline_packages_render_no_index_and_find_links(tmp_path: Path) -> None:
    m = load(
        tmp_path,
        f"""
        packages:
          index: null
          torch_index: null
          find_links: [/wheels, "http://127.0.0.1:8000/links/"]
        entries:
          - {ENTRY}
    """,
    )
    (e,) = m.entries
    assert e.torch_index is None
    assert m.packages.find_links == ("/wheels", "http://127.0.0.1:8000/links/")
    text = render.render_entry(m, e, builder="sdk")
    source = "--no-index --find-links /wheels --find-links http://127.0.0.1:8000/links/ "
    assert f"python3 -m pip install {source}uv==" in text
    assert f"RUN pip install {source}torch==2.9.1\n" in text
    assert f"pip install --target /opt/build-tools {source}ninja==" in text
    assert f"pip install --no-deps --no-compile --root /opt/fa-layer {source}einops==" in text
    assert "pip install --index-url" not in text
    assert "download.pytorch.org" not in text


def test_torch_index_null_takes_torch_from_the_main_index(tmp_path: Path) -> None:
    m = load(tmp_path, f'packages:\n  index: "http://pypi.mirror/simple"\n  torch_index: null\nentries:\n  - {ENTRY}\n')
    text = render.render_entry(m, m.entries[0], builder="sdk")
    assert "RUN pip install --index-url http://pypi.mirror/simple --trusted-host pypi.mirror torch==2.9.1\n" in text


def test_torch_index_template_is_filled_per_entry(tmp_path: Path) -> None:
    m = load(
        tmp_path,
        f"""
        packages:
          torch_index: "http://torch.mirror/{{cuda_tag}}/{{cuda}}/{{cuda_release}}"
        entries:
          - {ENTRY}
    """,
    )
    assert m.entries[0].torch_index == "http://torch.mirror/cu128/12.8/12.8.1"


def test_find_links_as_a_single_string(tmp_path: Path) -> None:
    m = load(tmp_path, f"packages:\n  index: null\n  find_links: /wheels\nentries:\n  - {ENTRY}\n")
    assert m.packages.find_links == ("/wheels",)
    assert "--find-links w " not in render.render_entry(m, m.entries[0], builder="sdk")


COMPAT_2_10 = """
    torch:
      "2.99.0":
        python: ["3.10", "3.11", "3.12", "3.13"]
        default_cuda: "13.0"
        cuda:
          "12.8": {cxx11_abi: true}
          "13.0": {cxx11_abi: true}
    gpus:
      RTXPRO6000: "12.0"
"""
USES_2_10 = """
    entries:
      - {python: "3.12", torch: "2.99.0", flash_attn: "2.8.3", target: [RTXPRO6000, H100]}
      - {python: "3.12", torch: "2.99.0", cuda: "12.8", flash_attn: "2.8.3", target: L40S}
"""


def check_2_10(m: Matrix) -> None:
    first, second = m.entries
    assert first.id == "fa2.8.3-py3.12-torch2.99.0-cu130"
    assert (first.cuda_release, first.cxx11_abi, first.archs) == ("13.0.1", True, ("90", "120"))
    assert first.gpus == ("RTXPRO6000", "H100")
    assert second.id == "fa2.8.3-py3.12-torch2.99.0-cu128"
    assert m.compat.torch["2.9.1"].default_cuda == "12.8"  # the built-in table is still there


def test_compat_override_adds_a_torch_release_and_a_gpu(tmp_path: Path) -> None:
    override = write(tmp_path, COMPAT_2_10, name="compat-extra.yaml")
    with pytest.raises(ConfigError, match=r"torch 2\.99\.0 is not in the compat table"):
        load(tmp_path, USES_2_10)
    check_2_10(load(tmp_path, USES_2_10, compat_override=override))


def test_compat_key_in_the_matrix_is_relative_to_the_matrix(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    write(tmp_path / "conf", COMPAT_2_10, name="compat-extra.yaml")
    path = write(tmp_path / "conf", "compat: compat-extra.yaml\n" + textwrap.dedent(USES_2_10))
    check_2_10(matrix_mod.load(path))


def test_compat_flag_on_the_command_line(tmp_path: Path) -> None:
    write(tmp_path, COMPAT_2_10, name="compat-extra.yaml")
    write(tmp_path, USES_2_10)
    result = run_cli("plan", "--json", "--compat", "compat-extra.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert [e["id"] for e in json.loads(result.stdout)] == [
        "fa2.8.3-py3.12-torch2.99.0-cu130",
        "fa2.8.3-py3.12-torch2.99.0-cu128",
    ]


def torch_2_10(python: str = '["3.12"]', default: str = '"12.8"', cuda: str = '"12.8"', abi: str = "true") -> str:
    return (
        f'torch:\n  "2.99.0":\n    python: {python}\n    default_cuda: {default}\n'
        f"    cuda:\n      {cuda}: {{cxx11_abi: {abi}}}\n"
    )


@pytest.mark.parametrize(
    ("body", "line", "message"),
    [
        (torch_2_10(abi='"yes"'), 6, "torch.2.99.0.cuda.12.8.cxx11_abi must be true or false"),
        (torch_2_10(default='"12.4"'), 4, "torch.2.99.0.default_cuda '12.4' is not one of its CUDA variants"),
        (torch_2_10(python="[3.12]"), 3, "torch.2.99.0.python.0: 3.12 must be a quoted string"),
        (torch_2_10(default='"12.7"', cuda='"12.7"'), 6, "torch 2.99.0 names CUDA 12.7, which the cuda section lacks"),
        ('flash_attn:\n  "2.8.3":\n    sha256: 1e71dd64a9e0\n', 3, "flash_attn.2.8.3.sha256 must be 64 hex digits"),
        ("gpus:\n  RTXPRO6000: 12.0\n", 2, "gpus.RTXPRO6000: 12.0 must be a quoted string"),
        ('archs:\n  "100": {min_cuda: 12.8}\n', 2, "archs.100.min_cuda: 12.8 must be a quoted string"),
    ],
)
def test_invalid_compat_override_names_the_override_file_and_line(
    tmp_path: Path, body: str, line: int, message: str
) -> None:
    override = tmp_path / "compat-extra.yaml"
    override.write_text(body)
    with pytest.raises(ConfigError) as info:
        load(tmp_path, f"entries:\n  - {ENTRY}\n", compat_override=override)
    got = [(p.file, p.line, p.message) for p in info.value.problems]
    assert got[0] == (str(override), line, message)
    assert all(file == str(override) for file, _, _ in got)


def test_compat_override_that_is_not_there(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, f"entries:\n  - {ENTRY}\n", compat_override=tmp_path / "nope.yaml")
    (p,) = info.value.problems
    assert (p.file, p.message) == (str(tmp_path / "nope.yaml"), "compat override not found")


def test_missing_compat_override_hint_is_about_compat(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, f"compat: extra.yaml\nentries:\n  - {ENTRY}\n")
    assert "--matrix" not in str(info.value)


# ----------------------------------------------------------------------------- select


def test_select(default_matrix: Matrix) -> None:
    assert default_matrix.select(None) == default_matrix.entries
    assert default_matrix.select([]) == default_matrix.entries
    (e,) = default_matrix.select(["fa2.8.3-py3.12-torch2.9.1-cu128"])
    assert e.id == "fa2.8.3-py3.12-torch2.9.1-cu128"
    # Matrix order, whatever the order asked in.
    two = default_matrix.select(["fa2.8.3-py3.10-torch2.9.1-cu128", "fa2.8.3-py3.11-torch2.6.0-cu124"])
    assert [x.id for x in two] == ["fa2.8.3-py3.11-torch2.6.0-cu124", "fa2.8.3-py3.10-torch2.9.1-cu128"]


def test_select_unknown_id_has_a_did_you_mean(default_matrix: Matrix) -> None:
    with pytest.raises(ConfigError) as info:
        default_matrix.select(["fa2.8.3-py3.12-torch2.9.1-cu128", "fa2.8.3-py3.12-torch2.9.1-cu129"])
    (p,) = info.value.problems
    assert p.message == "--only 'fa2.8.3-py3.12-torch2.9.1-cu129' is not an entry of this matrix"
    assert p.hint == "did you mean 'fa2.8.3-py3.12-torch2.9.1-cu128'?"
    assert p.file == str(REPO / "matrix.yaml")
    assert info.value.exit_code == 2


# ----------------------------------------------------------------------------- CLI


def test_cli_plan_json() -> None:
    result = run_cli("plan", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert isinstance(plan, list) and len(plan) == 4
    for item in plan:
        assert {"id", "python", "torch", "cuda", "flash_attn", "archs", "image"} <= set(item)
        assert isinstance(item["archs"], list) and all(isinstance(a, str) for a in item["archs"])
        assert item["image"] == f"ghcr.io/fa-images/flash-attn:{item['id']}"
    assert [(i["id"], i["python"], i["torch"], i["cuda"], tuple(i["archs"])) for i in plan] == [
        row[:5] for row in DEFAULT_PLAN
    ]
    assert plan[-1]["archs"] == ["80", "90"]


def test_cli_plan_text_defaults_to_matrix_yaml_in_the_current_directory() -> None:
    result = run_cli("plan")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1] == "4 entries in 3 compile groups (entries that share kernels)"
    assert lines[0].split() == [
        "fa2.8.3-py3.11-torch2.6.0-cu124",
        "archs",
        "80",
        "old",
        "ABI",
        "ghcr.io/fa-images/flash-attn:fa2.8.3-py3.11-torch2.6.0-cu124",
        "for",
        "A10G,",
        "L4",
    ]
    assert lines[3].split()[:5] == ["fa2.8.3-py3.10-torch2.9.1-cu128", "archs", "80,90", "new", "ABI"]


def test_cli_plan_without_a_matrix_here(tmp_path: Path) -> None:
    result = run_cli("plan", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        "error: matrix.yaml: matrix file not found (`fa-images init` writes a starter for this machine, "
        "`fa-images init --target aws` one for AWS G5/G6; or pass --matrix FILE)\n"
    )
    assert run_cli("build", cwd=tmp_path).stderr == result.stderr  # issue 30: build points to init too


def test_cli_plan_on_a_malformed_matrix_exits_2_with_one_error(tmp_path: Path) -> None:
    write(
        tmp_path,
        """
        entries:
          - {python: 3.10, torch: "2.9.1", flash_attn: "2.8.3", target: T4}
          - {python: "3.12", torch: "2.9.1", flash_attn: "2.8.3", target: A100, extra: 1}
    """,
        name="bad.yaml",
    )
    result = run_cli("plan", "--matrix", "bad.yaml", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: 3 problems found:\n")
    assert result.stderr.count("error:") == 1
    assert "  bad.yaml:2: entry entries[0]: python 3.10 must be a quoted string" in result.stderr
    assert "  bad.yaml:3: entry entries[1]: unknown key 'extra'" in result.stderr


def test_cli_plan_on_broken_yaml(tmp_path: Path) -> None:
    (tmp_path / "matrix.yaml").write_text("entries: [\n")
    result = run_cli("plan", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: matrix.yaml:2: invalid YAML: ")


@pytest.mark.parametrize("command", ["plan", "render", "wheel", "inspect"])
def test_cli_help_has_examples(command: str) -> None:
    result = run_cli(command, "--help")
    assert result.returncode == 0, result.stderr
    assert "examples:" in result.stdout
    assert f"fa-images {command}" in result.stdout.split("examples:")[1]


def test_compile_groups_join_entries_that_differ_only_in_python(default_matrix: Matrix) -> None:
    groups: dict[str, list[str]] = {}
    for e in default_matrix.entries:
        groups.setdefault(e.compile_group, []).append(e.id)
    assert groups == {
        "fa2.8.3-torch2.6.0-cu124-sm80": ["fa2.8.3-py3.11-torch2.6.0-cu124", "fa2.8.3-py3.12-torch2.6.0-cu124"],
        "fa2.8.3-torch2.9.1-cu128-sm80": ["fa2.8.3-py3.12-torch2.9.1-cu128"],
        "fa2.8.3-torch2.9.1-cu128-sm80_90": ["fa2.8.3-py3.10-torch2.9.1-cu128"],
    }
    assert all(e.summary()["group"] == e.compile_group for e in default_matrix.entries)


def test_torch_2_15_plans_on_its_default_cuda_13_2(tmp_path: Path) -> None:
    """torch 2.15.0's PyPI default is CUDA 13.2; the table knows 13.2 (cited in compat.yaml), so it plans."""
    m = load(tmp_path, '{entries: [{python: "3.12", torch: "2.15.0", flash_attn: "2.8.3", target: H100}]}')
    (entry,) = m.entries
    assert (entry.id, entry.cuda, entry.cuda_release, entry.cxx11_abi) == (
        "fa2.8.3-py3.12-torch2.15.0-cu132",
        "13.2",
        "13.2.1",
        True,
    )
    assert entry.devel_image == "nvidia/cuda:13.2.1-devel-ubuntu22.04"
    assert m.compat.cuda["13.2"].min_driver == "580"  # CUDA 13.x: driver >= 580 (minor version compatibility)
