"""``fa-images check IMAGE…``: on the node that pulls an image, does its flash-attn work on this GPU?

Each image is provided as ``build`` provides its bases (``--pull missing|always|never``; pulls log
in from the client config, as pushes do), then its own GPU check (``contract.GPU_CHECK_COMMAND``,
the command the build's gpu-check step runs) runs in a container with the GPUs (``--gpus``, as
``build``). The verdict is read from the check's exit code; the GPU, its arch and the check's last
line from its output; flash-attn, torch and CUDA from the image's labels. All of that is text from
the image, so it is bounded and escaped before it is printed.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..builder import contract, safe_io, untrusted
from ..builder import verdict as check_verdict
from ..builder.cli import exit_code_of
from ..builder.wording import counted
from ..config import grammar
from ..config.grammar import PullPolicy
from ..errors import EnvironmentProblem, StepFailed, UsageError
from . import bases
from .engine import Engine
from .gpus import GpuAccess, HostGpus
from .logger import Console, duration
from .report import message_of

Verdict = Literal["pass", "fail", "no GPU", "wrong arch", "not fa-images"]
# Exit code of each verdict, one each, so a script can tell them apart: the builder's own for no
# GPU and wrong arch, so the host's exit code is the check's.
EXIT_NOT_FA_IMAGES = 12  # the image carries no fa-images labels: it has no check of its own to run
EXIT_CODES: dict[Verdict, int] = {
    "pass": 0,
    "fail": 1,
    "no GPU": contract.EXIT_NO_GPU,
    "wrong arch": contract.EXIT_WRONG_ARCH,
    "not fa-images": EXIT_NOT_FA_IMAGES,
}
# Several images: the worst verdict is the exit code. A failure is worst (a broken image), then an
# image that is no fa-images image, then one this GPU cannot run, then a check that could not run
# for want of a GPU.
WORST_FIRST: tuple[Verdict, ...] = ("fail", "not fa-images", "wrong arch", "no GPU", "pass")


class CannotPull(EnvironmentProblem):
    """An image to check could not be provided (a pull that failed, or --pull never): nothing was
    checked. A code of its own, apart from a node without a GPU (3)."""

    exit_code = 11


# The labels the template sets on every runtime image (templates/Dockerfile.j2), and the JSON keys.
LABELS = {
    "flash_attn": "fa-images.flash-attn",
    "torch": "fa-images.torch",
    "cuda": "fa-images.cuda",
    "python": "fa-images.python",
    "archs": "fa-images.archs",
    "entry": "fa-images.entry",
}
MAX_TEXT = 300  # a label or an output line longer than this is cut: it came from the image
# How to give the engine an image without a registry, for the hint of a pull that failed.
OFFLINE = "`docker save IMAGE -o image.tar` where a registry is reachable, `docker load -i image.tar` here"
_GPU_LINE = re.compile(r"GPU: (?P<name>.{1,200}) \((?P<arch>sm_\d{2,3}[af]?)\)")
_VERDICT_PREFIXES = ("PASS:", "FAIL:", "NO GPU:", contract.WRONG_ARCH_PREFIX.strip())


@dataclass
class ImageCheck:
    """One image's verdict on this node: what ``--json`` prints per image."""

    image: str
    verdict: Verdict
    exit_code: int
    detail: str  # the check's verdict line, or why it did not run
    gpus: str  # the --gpus mode it ran with
    gpu: str | None = None  # "NVIDIA A10G", as the check saw it
    arch: str | None = None  # "sm_86"
    image_id: str | None = None
    labels: dict[str, str | None] = field(default_factory=dict)  # flash_attn, torch, cuda, python, archs, entry
    # wrong arch: the compat table's GPUs that run the image, each with its AWS instance families
    runs_on: list[str] = field(default_factory=list)
    seconds: float = 0.0
    # The check's comparisons as data, where they ran (its VERDICT line): what --attest signs.
    comparisons: check_verdict.Verdict | None = None
    # With --verify: the GPU verdicts the image already carried, each signed by the key.
    verdicts: list[dict[str, Any]] = field(default_factory=list)

    def line(self) -> str:
        """One line for a terminal; every part from the image is escaped."""
        gpu = f"{self.gpu} ({self.arch})" if self.gpu else "no GPU seen"
        said = ", ".join(
            f"{name.replace('_', '-')} {self.labels[key]}"
            for key, name in (("flash_attn", "flash-attn"), ("torch", "torch"), ("cuda", "CUDA"))
            if self.labels.get(key)
        )
        parts = [self.verdict.upper(), gpu, said or "no fa-images labels", self.detail]
        return untrusted.shown(f"{self.image}: " + " · ".join(parts))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def checked_refs(refs: list[str]) -> list[str]:
    """The image refs, each by the grammar Docker applies, before the engine sees any; one error for all."""
    bad = [f"{untrusted.shown(ref[:200])!r} {why}" for ref in refs if (why := grammar.image_reference(ref))]
    if bad:
        raise UsageError(
            f"not an image reference: {'; '.join(bad)}",
            hint="e.g. ghcr.io/acme/flash-attn:fa2.8.3-py3.12-torch2.9.1-cu128 (name[:tag][@sha256:…])",
        )
    return list(dict.fromkeys(refs))


def _gpu_for(engine: Engine, access: GpuAccess) -> tuple[bool | HostGpus, str]:
    """What the check's container gets, and a note when it gets no GPU."""
    if access.mode == "none":
        return False, "--gpus none"
    if access.host is not None:
        return access.host, ""
    if not engine.has_gpu_runtime():
        return False, "the engine has no GPU runtime (NVIDIA Container Toolkit); --gpus devices needs none"
    return True, ""


def _text(value: object) -> str | None:
    return value[:MAX_TEXT] if isinstance(value, str) and value else None


def check_image(engine: Engine, ref: str, access: GpuAccess, on_line: Callable[[str], None]) -> ImageCheck:
    """Runs the image's own GPU check; the verdict comes from its exit code."""
    started = time.monotonic()
    info = engine.image_info(ref)
    labels = {key: _text((info.labels if info else {}).get(label)) for key, label in LABELS.items()}
    gpu, why_none = _gpu_for(engine, access)
    result = ImageCheck(ref, "fail", 1, "", access.mode, image_id=info.id if info else None, labels=labels)
    if not labels["flash_attn"]:  # not made by fa-images: it has no check of its own to run
        result.verdict, result.exit_code = "not fa-images", EXIT_NOT_FA_IMAGES
        result.detail = f"NOT FA-IMAGES: no {LABELS['flash_attn']} label; fa-images checks the images it built"
        result.seconds = round(time.monotonic() - started, 1)
        return result
    try:
        run = engine.run(ref, list(contract.GPU_CHECK_COMMAND), gpu=gpu, keep=False, on_line=on_line)
    except StepFailed as exc:
        result.detail = f"the check could not run: {str(exc)[:MAX_TEXT]}"
        result.seconds = round(time.monotonic() - started, 1)
        return result
    output = [line[:MAX_TEXT] for line in run.output]
    for line in output:
        if match := _GPU_LINE.fullmatch(line.strip()):
            result.gpu, result.arch = match["name"], match["arch"]
    said = [line.strip() for line in output if line.strip().startswith(_VERDICT_PREFIXES)]
    result.verdict = _verdict(run.exit_code)
    try:
        result.comparisons = check_verdict.parse(run.output)
    except ValueError as exc:  # the image's own output: a verdict line that is not one fails it
        result.verdict, run_said = "fail", f"its verdict line is not one: {untrusted.shown(str(exc))[:200]}"
        said.append(run_said)
    if result.verdict == "no GPU" and isinstance(gpu, HostGpus):  # as in `build`: devices passed, none seen
        result.verdict, why_none = "fail", "--gpus devices passed the GPUs, and torch in the image sees none"
    result.exit_code = EXIT_CODES[result.verdict]
    last = said[-1] if said else (output[-1].strip() if output else f"exited with {run.exit_code}, no output")
    if result.verdict == "fail" and run.exit_code not in (0, 1):
        last = f"exited with {run.exit_code}: {last}"
    result.detail = last + (f" ({why_none})" if why_none else "")
    if result.verdict == "wrong arch":
        result.runs_on = _gpus_that_run(labels.get("archs"))
        result.detail += f"; GPUs that run it: {', '.join(result.runs_on)}" if result.runs_on else ""
    result.seconds = round(time.monotonic() - started, 1)
    return result


def _gpus_that_run(archs_label: str | None) -> list[str]:
    """The built-in compat table's GPUs that run the archs of the image's label ('80,90'); the
    image's check names archs only (the builder has no GPU table)."""
    from ..config import compat

    archs = [a.strip() for a in (archs_label or "").split(",") if a.strip()]
    return compat.load().gpus_that_run(archs) if archs else []


def _verdict(code: int) -> Verdict:
    if code == 0:
        return "pass"
    if code == contract.EXIT_NO_GPU:
        return "no GPU"
    if code == contract.EXIT_WRONG_ARCH:
        return "wrong arch"
    return "fail"


def worst(results: list[ImageCheck]) -> int:
    """The exit code of several images: that of the worst verdict."""
    verdicts = {r.verdict for r in results}
    return next((EXIT_CODES[v] for v in WORST_FIRST if v in verdicts), 0)


def to_json(results: list[ImageCheck], engine: str, failure: BaseException | None = None) -> str:
    """``failure``: what stopped the command before every image was checked (a pull that failed)."""
    data = {
        "engine": engine,
        "exit_code": worst(results) if failure is None else exit_code_of(failure),
        "ok": failure is None and all(r.verdict == "pass" for r in results),
        "error": None if failure is None else message_of(failure),
        "images": [r.to_dict() for r in results],
    }
    return json.dumps(data, indent=2)


def write_report(path: Path, results: list[ImageCheck], engine: str, failure: BaseException | None = None) -> None:
    text = to_json(results, engine, failure) + "\n"
    safe_io.write_file(path, text, what="--report")  # atomic, never through a link


def run(engine: Engine, refs: list[str], *, pull: PullPolicy, access: GpuAccess, console: Console) -> list[ImageCheck]:
    """Provides every image first (a pull that fails stops here, before any check), then checks each."""
    started = time.monotonic()
    try:
        bases.provide(engine, refs, pull, console, what="image", offline=OFFLINE)
    except EnvironmentProblem as exc:
        raise CannotPull(exc.message, hint=exc.hint) from None
    results = [check_image(engine, ref, access, lambda _line: None) for ref in refs]
    console.line(f"checked {counted(len(results), 'image')} in {duration(time.monotonic() - started)}")
    return results
