"""The flash-attn generations fa-images builds, and what tells them apart.

A matrix names a generation by its version: flash-attn 2.x is FlashAttention-2 (``flash_attn``,
from PyPI's sdists), 3.x is FlashAttention-3 (``flash_attn_3``, flash-attention's ``hopper/``
from a pinned source archive), 4.x FlashAttention-4 (``flash-attn-4``, pure Python on the CuTe
DSL, whose kernels are compiled ahead of time by fa4.py). Each has its own project name,
compiled extension, wheel tags and checks; everything that reads a wheel or an image asks this
module which one it has.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from ..errors import UsageError

if TYPE_CHECKING:
    from . import steps as steps_mod


@dataclass(frozen=True)
class Generation:
    number: int
    project: str  # the canonical project name pip and the index use
    package: str  # what ``import`` names
    # The compiled extension: its module, and where it lies in a wheel (a prefix of the member).
    extension_module: str
    extension_member: str
    # abi3: one wheel for every Python from the oldest it names, on torch's stable ABI
    abi3: bool
    source: str  # how it is had: "sdist" (PyPI's, compiled), "archive" (pinned, fa3.py), "pypi" (its wheel)
    # A top-level module only this generation installs, found without importing it (None: FA4's
    # flash_attn.cute lies under flash-attn 2's package).
    own_module: str | None
    # Its module: how its wheel is prepared, compiled and verified (steps.Steps); ".fa2" is one of
    # this package, a name without the dot one outside it (as importlib reads a name).
    steps_module: str
    # Its module that checks it on a GPU (imports torch; named as steps_module is), or None:
    # gpucheck.py's own (flash-attn 2's).
    check_module: str | None = None
    # How a local source archive of it is named ("flash_attn_3-"): `wheel --sdist FILE` alone.
    archive_prefix: str | None = None

    @property
    def name(self) -> str:
        return f"FlashAttention-{self.number}"

    def steps(self) -> steps_mod.Steps:
        """Its build steps, imported when a build asks for them."""
        return cast("steps_mod.Steps", importlib.import_module(self.steps_module, __name__))

    def owns(self, member: str) -> bool:
        """Whether a wheel member is this generation's compiled extension (FA4 has none)."""
        return bool(self.extension_member) and member.startswith(self.extension_member) and member.endswith(".so")


FA2 = Generation(
    number=2,
    project="flash-attn",
    package="flash_attn",
    extension_module="flash_attn_2_cuda",
    extension_member="flash_attn_2_cuda.",
    abi3=False,
    source="sdist",
    own_module="flash_attn_2_cuda",
    steps_module=".fa2",
)
FA3 = Generation(
    number=3,
    project="flash-attn-3",
    package="flash_attn_interface",
    extension_module="flash_attn_3._C",
    extension_member="flash_attn_3/_C.",
    abi3=True,
    source="archive",
    own_module="flash_attn_interface",
    steps_module=".fa3",
    check_module=".fa3_check",
    archive_prefix="flash_attn_3-",
)
# Pure Python (the CuTe DSL): its kernels compile at their first call, or ahead of it (fa4.py).
FA4 = Generation(
    number=4,
    project="flash-attn-4",
    package="flash_attn.cute",
    extension_module="",
    extension_member="",
    abi3=False,
    source="pypi",
    own_module=None,
    steps_module=".fa4",
    check_module=".fa4",
)
GENERATIONS = (FA2, FA3, FA4)


def of_version(version: str, *, untested: bool = False) -> Generation:
    """The generation a flash-attn version names: its major version. ``untested``: a major no
    generation has is tried as flash-attn 2's sdist (``wheel --allow-untested``)."""
    try:
        major = Version(version).major
    except InvalidVersion:
        raise UsageError(f"{version!r} is not a valid flash-attn version") from None
    for generation in GENERATIONS:
        if generation.number == major:
            return generation
    if untested:
        return FA2
    raise UsageError(
        f"flash-attn {version} names FlashAttention-{major}, which fa-images does not build",
        hint="fa-images knows FlashAttention-2 (2.x), FlashAttention-3 (3.x) and FlashAttention-4 (4.x)",
    )


def of_number(number: int) -> Generation:
    """The generation a settings file or a report records by its number."""
    found = next((g for g in GENERATIONS if g.number == number), None)
    if found is None:
        raise UsageError(f"FlashAttention-{number} is not a generation fa-images builds")
    return found


def of_archive(name: str) -> Generation:
    """The generation of a local source archive given without a version: by its name, else flash-attn 2's sdist."""
    return next((g for g in GENERATIONS if g.archive_prefix and name.startswith(g.archive_prefix)), FA2)


def of_project(name: str) -> Generation | None:
    """The generation of a wheel's project name, or None for another project."""
    canonical = canonicalize_name(name)
    return next((g for g in GENERATIONS if g.project == canonical), None)
