"""The GPU check's verdict as data: what ran, on which GPU, by which rule, and each comparison.

The check prints it before its last line (``contract.VERDICT_PREFIX`` and one JSON object); the host
reads that line from the container's output (``parse``), bounded like any bytes it did not make,
and signs it as an attestation of the image and its wheel. Only a check that ran its comparisons
has a verdict: no GPU and a wrong arch ran nothing.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from . import untrusted
from .comparison import CaseResult
from .contract import VERDICT_PREFIX

MAX_LINE = 64 * 1024  # a verdict of a few dozen cases; anything longer is not one
MAX_CASES = 512
# The release of the kernel module, as /proc/driver/nvidia/version names it ("Kernel Module  550.54.15").
_DRIVER = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+){1,3})\b")
_TEXT = re.compile(r"[^\x00-\x1f\x7f-\x9f]{1,200}")  # one short line: no control character
_CAPABILITY = re.compile(r"\d{1,2}\.\d{1,2}")


@dataclass(frozen=True)
class Case:
    name: str
    ok: bool
    err: float | None  # None where the case states its result in words (FA4's compile count)
    bound: float | None
    said: str | None = None

    @classmethod
    def of(cls, result: CaseResult) -> Case:
        finite = math.isfinite(result.err) and math.isfinite(result.bound)
        err, bound = (result.err, result.bound) if finite else (None, None)
        return cls(result.name, result.ok, err, bound, result.said)


@dataclass(frozen=True)
class Verdict:
    """One run of one generation's GPU check."""

    generation: str  # "FlashAttention-2"
    passed: bool
    gpu: str  # torch's device name: "NVIDIA H100 80GB HBM3"
    capability: str  # "9.0"
    driver: str | None  # the kernel module's release, where the container sees it
    torch: str
    cuda: str | None  # the CUDA torch was built with
    reference: str  # what the cases compare with
    rule: str  # the tolerance rule, in words
    cases: tuple[Case, ...]
    seconds: float

    @property
    def sm(self) -> str:
        return "sm_" + self.capability.replace(".", "")

    def line(self) -> str:
        return VERDICT_PREFIX + json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)

    def to_dict(self) -> dict:
        return asdict(self) | {"cases": [asdict(c) for c in self.cases]}

    @classmethod
    def from_dict(cls, data: object) -> Verdict:
        """The verdict ``data`` holds; ValueError naming the first field that is not what a check writes."""
        if not isinstance(data, dict):
            raise ValueError("a verdict is a JSON object")
        texts: dict[str, str] = {}
        for key in ("generation", "gpu", "torch", "reference", "rule"):
            value = data.get(key)
            if not isinstance(value, str) or not _TEXT.fullmatch(value):
                raise ValueError(f"verdict field {key!r} is not a short printable text")
            texts[key] = value
        for key in ("driver", "cuda"):
            if data.get(key) is not None and not (isinstance(data[key], str) and _TEXT.fullmatch(data[key])):
                raise ValueError(f"verdict field {key!r} is not a short printable text")
        if not isinstance(data.get("capability"), str) or not _CAPABILITY.fullmatch(data["capability"]):
            raise ValueError("verdict field 'capability' is not a compute capability such as 9.0")
        if not isinstance(data.get("passed"), bool):
            raise ValueError("verdict field 'passed' is not true or false")
        seconds = data.get("seconds")
        if not isinstance(seconds, (int, float)) or not _number(seconds) or seconds < 0:
            raise ValueError("verdict field 'seconds' is not a duration")
        raw = data.get("cases")
        if not isinstance(raw, list) or not 0 < len(raw) <= MAX_CASES:
            raise ValueError(f"verdict field 'cases' is not a list of 1 to {MAX_CASES} cases")
        cases = tuple(_case(c) for c in raw)
        if data["passed"] != all(c.ok for c in cases):
            raise ValueError("verdict field 'passed' disagrees with its cases")
        return cls(**texts, capability=data["capability"], driver=data.get("driver"), cuda=data.get("cuda"),
                   passed=data["passed"], cases=cases, seconds=float(seconds))  # fmt: skip


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _case(data: object) -> Case:
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not _TEXT.fullmatch(data["name"]):
        raise ValueError("a verdict case has no short printable name")
    if not isinstance(data.get("ok"), bool):
        raise ValueError(f"verdict case {data['name']!r}: 'ok' is not true or false")
    for key in ("err", "bound"):
        if data.get(key) is not None and not _number(data[key]):
            raise ValueError(f"verdict case {data['name']!r}: {key!r} is not a finite number")
    said = data.get("said")
    if said is not None and not (isinstance(said, str) and _TEXT.fullmatch(said)):
        raise ValueError(f"verdict case {data['name']!r}: 'said' is not a short printable text")
    return Case(data["name"], data["ok"], data.get("err"), data.get("bound"), said)


def parse(lines: list[str]) -> Verdict | None:
    """The verdict among a check's output lines (its last one wins), None where it printed none.
    ValueError where the line is there but is not a verdict: an image's output is not trusted."""
    found = [line for line in lines if line.startswith(VERDICT_PREFIX)]
    if not found:
        return None
    text = found[-1].removeprefix(VERDICT_PREFIX)
    if len(text) > MAX_LINE:
        raise ValueError(f"the verdict line is over {MAX_LINE} characters")
    # UntrustedInput, a ValueError, for JSON past its depth or digit limits
    return Verdict.from_dict(untrusted.parse_json(text.encode(), what="the verdict line"))


def driver_release(path: Path = Path("/proc/driver/nvidia/version")) -> str | None:
    """The NVIDIA kernel module's release, which a container sees through the host's /proc."""
    try:
        head = path.read_text(errors="replace")[:4096]
    except OSError:
        return None
    found = _DRIVER.search(head)
    return found.group(1) if found else None
