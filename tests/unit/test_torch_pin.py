"""`inspect` reads the torch a wheel pins in its METADATA and checks it against its label.

Small wheel zips with METADATA only: the pin is checked before the extension is looked for.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from fa_images.builder import verify

LABELLED = "2.8.3+cu128torch2.9cxx11abitrue"


def wheel_with(tmp_path: Path, version: str, requires: list[str]) -> Path:
    path = tmp_path / f"flash_attn-{version}-cp312-cp312-linux_x86_64.whl"
    metadata = f"Metadata-Version: 2.1\nName: flash_attn\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires) + "\nRequires-Dist: torch\n"  # body, not header
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"flash_attn-{version}.dist-info/METADATA", metadata)
        zf.writestr(f"flash_attn-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\n")
    return path


# (version, Requires-Dist lines, status, words in the detail)
PINS = [
    (LABELLED, ["torch==2.9.*", "einops"], "pass", "requires torch==2.9.*, as its label"),
    ("2.8.3", ["torch==2.9.*"], "pass", "requires torch==2.9.*"),
    ("2.8.3", ["torch==2.9.1"], "pass", "requires torch==2.9.1"),
    (LABELLED, ["torch", "einops"], "fail", "not one torch series"),
    (LABELLED, ["torch>=2.0"], "fail", "not one torch series"),
    (LABELLED, ["torch==2.9.*", "torch<3"], "fail", "not one torch series"),
    (LABELLED, ["torch==2.11.*"], "fail", "but its label says torch 2.9"),
    (LABELLED, ["Torch == 2.9.*; platform_system == 'Linux'"], "pass", "as its label"),
    (LABELLED, ["einops"], "skip", "requires no torch"),
    (LABELLED, ["torch >>> 2", "einops"], "skip", "requires no torch"),  # not a requirement: not read as one
]


@pytest.mark.parametrize(("version", "requires", "status", "says"), PINS)
def test_the_torch_pin(tmp_path: Path, version: str, requires: list[str], status: str, says: str) -> None:
    report = verify.inspect_wheel(wheel_with(tmp_path, version, requires), import_check=False)
    checks = {c.name: (c.status, c.detail) for c in report.checks}
    assert checks["torch pin"][0] == status, checks
    assert says in checks["torch pin"][1]


def test_the_pin_is_in_the_json(tmp_path: Path) -> None:
    report = verify.inspect_wheel(wheel_with(tmp_path, LABELLED, ["torch==2.9.*"]), import_check=False)
    data = json.loads(report.to_json())
    assert (data["torch_requirement"], data["torch_series"]) == ("torch==2.9.*", "2.9")


@pytest.mark.parametrize(
    ("series", "torch", "excluded"),
    [
        ("2.9", "2.9.1+cu128", False),
        ("2.9", "2.11.0+cu130", True),
        ("2.9", "2.9.0a0+git", False),
        (None, "2.11", False),
    ],
)
def test_a_local_torch_outside_the_pin_is_named(series: str | None, torch: str, excluded: bool) -> None:
    report = verify.WheelReport(wheel="w.whl", torch_series=series)
    assert verify._pin_excludes(report, torch) is excluded
