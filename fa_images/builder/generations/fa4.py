"""FlashAttention-4 (``flash-attn-4``, imported as ``flash_attn.cute``): its kernels compiled ahead
of time into an on-disk cache, and the check that a new process runs them with no compile.

FA4 is CuTe DSL Python: each kernel specialisation is compiled on its first call, seconds each.
Its cache (``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED`` and ``_DIR``, read when it is imported)
keeps them on disk, under a fingerprint of FA4's sources, the Python minor and the DSL's versions.
Its interface also compiles without a GPU, under torch's fake tensors: ``FLASH_ATTENTION_ARCH``
picks the kernels, ``CUTE_DSL_ARCH`` is the compile target and ``FLASH_ATTENTION_NUM_SMS`` the
SKU's SM count its heuristics read (tiles, split-KV, pack-GQA). ``warm`` compiles a declared
grid that way, where no GPU is; ``cases`` runs the same grid on one and counts the compiles.

A kernel is keyed by what its call looks like (dtype, head dim, query heads per KV head, causal,
whether the LSE is kept for a backward, the heuristics' choices for the shapes), so the grid
names shapes, and a grid compiled for one SKU may miss on another with other SMs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import argtypes, safe_io, untrusted
from ..comparison import CaseResult, sdpa
from ..errors import UsageError
from .steps import PreparedSource, SourceRequest

if TYPE_CHECKING:
    from ..environment import NvccInfo, TorchInfo
    from ..settings import BuildSettings
    from ..wheelfile import Wheel

REFERENCE = "an fp32 reference"  # what its check's cases compare with, for the verdict line
RULE = (
    "max|err| <= 2 x max|err| of SDPA in the same dtype + atol (fp16 1e-3, bf16 8e-3); "
    "a declared grid compiles no kernel at its first calls"
)
CACHE_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"
CACHE_ON_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"
GRID_FILE = "fa-images-grid.json"  # written beside the kernels: the check runs what was compiled
TARGETS_FILE = "fa-images-targets.json"  # the GPUs they were compiled for: the check's arch verdict
DTYPES = ("bf16", "fp16")
# The kernels of one call compiled ahead, in the one process fa4-cache runs: 16 calls' 31 kernels
# took 58 s with no GPU (bench/results/fa4-container-h100/build.log).
SECONDS_PER_CALL = 58 / 16
MAX_CALLS = 256  # a grid's calls: as many as 2 dtypes x 8 head dims x causal and not x 4 KV head counts x 2 modes
MODES = ("train", "infer")  # forward keeping the LSE, then backward; a forward without grad
# The compute capability majors 4.0.0b36's interface dispatches (`assert arch // 10 in [8, 9, 10, 11, 12]`),
# and those whose backward it has: 8.x (Ampere, Ada) runs the forward only.
MAJORS = (8, 9, 10, 11, 12)
BACKWARD_MAJORS = (9, 10, 11, 12)


@dataclass(frozen=True)
class Fa4Target:
    """A GPU a grid is compiled for with none here: its name, compute capability and SM count (the
    compat table's GPU facts, which the host passes as ``NAME:CAPABILITY:SMS``)."""

    name: str
    capability: str  # '9.0'
    sms: int

    @property
    def arch(self) -> str:
        """What FA4 selects kernels by, and keys its cache on: the GPU's own capability."""
        return "sm_" + self.capability.replace(".", "")

    @property
    def compile_target(self) -> str:
        """The DSL's target: the arch-specific one ('a') from 9.0, where the kernels use its features."""
        return self.arch + ("a" if self.major >= 9 else "")

    @property
    def major(self) -> int:
        return int(self.capability.split(".")[0])

    def argument(self) -> str:
        return f"{self.name}:{self.capability}:{self.sms}"

    @classmethod
    def parse(cls, text: str) -> Fa4Target:
        name, _, rest = text.partition(":")
        capability, _, sms = rest.partition(":")
        if not (name.isalnum() and len(name) <= 32 and capability.replace(".", "", 1).isdigit() and "." in capability):
            raise ValueError(f"{text!r} is not NAME:CAPABILITY:SMS, e.g. H100:9.0:132")
        if not (sms.isdigit() and 1 <= int(sms) <= 1024):
            raise ValueError(f"{text!r}: the SM count must be 1 to 1024")
        target = cls(name, capability, int(sms))
        if target.major not in MAJORS:
            raise ValueError(f"{text!r}: FlashAttention-4 runs on compute capability {MAJORS[0]}.x to {MAJORS[-1]}.x")
        return target


def refused(point_mode: str, major: int) -> str | None:
    """Why FA4 refuses a call of this mode on a GPU of this major, or None (its interface's rules)."""
    if point_mode == "train" and major not in BACKWARD_MAJORS:
        return f"its backward runs on {BACKWARD_MAJORS[0]}.x to {BACKWARD_MAJORS[-1]}.x: inference only"
    return None


@dataclass(frozen=True)
class Point:
    """One call of the grid: what FA4 specialises a kernel on, and the shapes its heuristics read."""

    head_dim: int
    dtype: str
    causal: bool
    heads: int
    kv_heads: int
    batch: int
    seqlen: int
    mode: str

    def name(self) -> str:
        gqa = f" GQA {self.heads}/{self.kv_heads}" if self.kv_heads != self.heads else ""
        return f"{self.dtype} hdim {self.head_dim} {'causal' if self.causal else 'full'}{gqa} {self.mode}"


@dataclass(frozen=True)
class Fa4Grid:
    """The calls whose kernels an image carries compiled: common LLM attention shapes by default."""

    head_dims: tuple[int, ...] = (64, 128)
    dtypes: tuple[str, ...] = ("bf16",)
    causal: tuple[bool, ...] = (False, True)
    kv_heads: tuple[int, ...] = (16, 4)  # of 16 query heads: MHA and GQA 4:1
    heads: int = 16
    batch: int = 2
    seqlen: int = 2048
    modes: tuple[str, ...] = MODES

    def __post_init__(self) -> None:
        for name in ("head_dims", "dtypes", "causal", "kv_heads", "modes"):  # a value twice is one call
            object.__setattr__(self, name, tuple(dict.fromkeys(getattr(self, name))))
        bad = []
        if not self.head_dims or any(d % 8 or not 8 <= d <= 256 for d in self.head_dims):
            bad.append(f"head dims {list(self.head_dims)}: multiples of 8 from 8 to 256")
        if not self.dtypes or set(self.dtypes) - set(DTYPES):
            bad.append(f"dtypes {list(self.dtypes)}: of {list(DTYPES)}")
        if not self.kv_heads or any(k < 1 or self.heads % k for k in self.kv_heads):
            bad.append(f"kv heads {list(self.kv_heads)}: each must divide the {self.heads} query heads")
        if not self.modes or set(self.modes) - set(MODES):
            bad.append(f"modes {list(self.modes)}: of {list(MODES)}")
        if not (1 <= self.batch <= 64 and 1 <= self.seqlen <= 1 << 17 and 1 <= self.heads <= 256):
            bad.append("batch 1..64, seqlen 1..131072, heads 1..256")
        calls = len(self.head_dims) * len(self.dtypes) * len(self.causal) * len(self.kv_heads) * len(self.modes)
        if not bad and calls > MAX_CALLS:
            bad.append(f"{calls} calls; at most {MAX_CALLS} (each compiles seconds of kernels into every image)")
        if bad:
            raise UsageError("FA4 grid: " + "; ".join(bad))

    def points(self, major: int | None = None) -> list[Point]:
        """Its calls; with ``major``, those FA4 runs on a GPU of that compute capability major."""
        return [
            Point(d, t, c, self.heads, k, self.batch, self.seqlen, m)
            for d in self.head_dims
            for t in self.dtypes
            for c in self.causal
            for k in self.kv_heads
            for m in self.modes
            if major is None or refused(m, major) is None
        ]

    def describe(self) -> str:
        causal = "causal and full" if len(self.causal) > 1 else ("causal" if self.causal[0] else "full")
        kv = ",".join(map(str, self.kv_heads))
        return (
            f"hdim {','.join(map(str, self.head_dims))}; {','.join(self.dtypes)}; {causal}; {self.heads} heads, "
            f"kv {kv}; batch {self.batch} x {self.seqlen}; {'+'.join(self.modes)}"
        )

    def arguments(self) -> list[str]:
        """The builder's ``fa4-cache`` flags that ask for this grid."""
        return [
            "--head-dims", ",".join(map(str, self.head_dims)), "--dtypes", ",".join(self.dtypes),
            "--causal", ",".join(str(c).lower() for c in self.causal), "--kv-heads", ",".join(map(str, self.kv_heads)),
            "--heads", str(self.heads), "--batch", str(self.batch), "--seqlen", str(self.seqlen),
            "--modes", ",".join(self.modes),
        ]  # fmt: skip

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Fa4Grid:
        raw = json.loads(text)
        if not isinstance(raw, dict) or set(raw) - set(cls.__dataclass_fields__):
            raise UsageError(f"{GRID_FILE} is not a grid fa-images wrote")
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
        return cls(**values)


def kernels_in(cache: Path) -> int:
    """How many compiled kernels the cache holds (one object file each)."""
    return sum(1 for p in cache.rglob("*.o") if p.is_file()) if cache.is_dir() else 0


def use_cache(cache: Path, target: Fa4Target | None = None) -> None:
    """FA4's environment in this process: its cache on, in ``cache``; with ``target``, kernels
    compiled for that GPU with none here. FA4 reads it when it is imported, so this comes first."""
    os.environ[CACHE_ON_ENV] = "1"
    os.environ[CACHE_ENV] = str(cache)
    if target is not None:
        os.environ.update(
            FLASH_ATTENTION_ARCH=target.arch,
            CUTE_DSL_ARCH=target.compile_target,
            FLASH_ATTENTION_NUM_SMS=str(target.sms),
        )


def compiled_for(cache: Path) -> list[Fa4Target]:
    """The GPUs a cache's kernels were compiled for, as ``warm`` recorded them ([] where none)."""
    path = cache / TARGETS_FILE
    if not path.is_file():
        return []
    try:
        raw = json.loads(path.read_text()[: 1 << 16])
        return [Fa4Target.parse(text) for text in raw if isinstance(text, str)][:64]
    except (ValueError, OSError):
        return []


def warm(grid: Fa4Grid, cache: Path, *, target: Fa4Target, log: Callable[[str], None] = print) -> int:
    """Compiles every call of ``grid`` that FA4 runs on ``target`` into ``cache``, under fake tensors:
    no GPU, no kernel run. Returns the number of kernels the cache holds."""
    points = grid.points(target.major)
    if not points:
        raise UsageError(
            f"{target.name} ({target.arch}): none of the grid's calls runs there: {refused('train', target.major)}"
        )
    out = safe_io.OutputDir(cache, what="--out")  # a folder of its own, never reached through a link
    use_cache(cache, target)
    started = time.monotonic()
    left_out = len(grid.points()) - len(points)
    if left_out:
        log(f"{target.name} ({target.arch}): {left_out} of the grid's calls left out: {refused('train', target.major)}")
    _compile(points, log)
    out.write_text(GRID_FILE, grid.to_json() + "\n")
    targets = {t.argument(): None for t in compiled_for(cache)} | {target.argument(): None}
    out.write_text(TARGETS_FILE, json.dumps(list(targets)) + "\n")
    count = kernels_in(cache)
    took = time.monotonic() - started
    log(f"{count} kernels in the cache after {target.name} ({target.compile_target}, {target.sms} SMs), {took:.0f} s")
    return count


def _compile(points: list[Point], log: Callable[[str], None]) -> None:
    import torch
    from flash_attn.cute import interface  # type: ignore[import-not-found]
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        for point in points:
            before = time.monotonic()
            q, k, v = _tensors(point, device="cuda", grad=point.mode == "train")
            # The interface's own functions, with the arguments flash_attn_func's autograd passes them
            # (a kernel is keyed on them): autograd needs a real CUDA device to record a graph on.
            out, lse, *_ = interface._flash_attn_fwd(q, k, v, causal=point.causal, softcap=0.0, num_splits=1)
            if point.mode == "train":
                interface._flash_attn_bwd(q, k, v, out, torch.empty_like(out), lse, None, point.causal, 0.0)
            log(f"  {point.name()}: {time.monotonic() - before:.1f} s")


def _tensors(point: Point, *, device: str, grad: bool):
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[point.dtype]
    q = torch.randn(point.batch, point.seqlen, point.heads, point.head_dim, device=device, dtype=dtype)
    k, v = (
        torch.randn(point.batch, point.seqlen, point.kv_heads, point.head_dim, device=device, dtype=dtype)
        for _ in range(2)
    )
    return [t.requires_grad_(grad) for t in (q, k, v)]


@dataclass(frozen=True)
class FirstCall:
    point: Point
    seconds: float
    compiles: int  # kernels the cache gained: 0 where the call found every kernel compiled


def configured_cache() -> Path | None:
    """The cache this process's FA4 uses (an image sets it), or None where it has none."""
    on, where = os.environ.get(CACHE_ON_ENV) == "1", os.environ.get(CACHE_ENV)
    return Path(where) if on and where else None


def cases(cache: Path, grid: Fa4Grid, major: int | None = None) -> tuple[list[CaseResult], list[FirstCall]]:
    """Runs ``grid`` on this GPU through FA4's public function, in a process whose FA4 uses
    ``cache`` (``use_cache`` before FA4 is imported): each first call timed and its compiles
    counted, its output and gradients compared with an fp32 reference by the rule of flash-attn's
    tests (at most twice the error of the same math in the input dtype)."""
    import torch
    from flash_attn.cute import flash_attn_func

    results: list[CaseResult] = []
    calls: list[FirstCall] = []
    for point in grid.points(major):
        torch.manual_seed(0)
        q, k, v = _tensors(point, device="cuda", grad=point.mode == "train")
        grad = torch.randn_like(q[..., : point.head_dim]) if point.mode == "train" else None
        kernels = kernels_in(cache)
        torch.cuda.synchronize()
        started = time.monotonic()
        with torch.set_grad_enabled(grad is not None):
            out = flash_attn_func(q, k, v, causal=point.causal)
            out = out[0] if isinstance(out, tuple) else out
            if grad is not None:
                out.backward(grad)
        torch.cuda.synchronize()
        calls.append(FirstCall(point, time.monotonic() - started, kernels_in(cache) - kernels))
        results += _compare(point, (q, k, v), out, grad)
    return results, calls


def _compare(point: Point, qkv, out, grad) -> list[CaseResult]:
    """out (and dq, dk, dv) against attention in fp32, within 2x the error of the same in the input dtype."""
    groups = point.heads // point.kv_heads

    def expand(t):
        return t.repeat_interleave(groups, dim=2) if groups > 1 else t

    ref_in = [t.detach().float().requires_grad_(grad is not None) for t in qkv]
    low_in = [t.detach().clone().requires_grad_(grad is not None) for t in qkv]
    ref = sdpa([ref_in[0], expand(ref_in[1]), expand(ref_in[2])], point.causal)
    low = sdpa([low_in[0], expand(low_in[1]), expand(low_in[2])], point.causal)
    pairs = [("forward", out, ref, low)]
    if grad is not None:
        ref.backward(grad.float())
        low.backward(grad)
        pairs += [(f"d{n}", a.grad, r.grad, lo.grad) for n, a, r, lo in zip("qkv", qkv, ref_in, low_in)]
    slack = {"bf16": 8e-3, "fp16": 1e-3}[point.dtype]
    found = []
    for name, mine, r, lo in pairs:
        err = (mine.float() - r).abs().max().item()
        bound = 2 * (lo.float() - r).abs().max().item() + slack
        found.append(CaseResult(f"{name} {point.name()}", err, bound))
    return found


# --- the GPU check's parts (gpucheck.checks_for) ---------------------------------------------------


def prepare_check() -> Path:
    """The cache this check's FA4 uses: the image's, else a new one (every first call then
    compiles, and says so). Set before FA4 is imported."""
    cache = configured_cache()
    if cache is None:
        import tempfile

        cache = Path(tempfile.mkdtemp(prefix="fa-images-fa4-cache-"))
        use_cache(cache)
    return cache


def import_check() -> str:
    cache = prepare_check()
    from importlib.metadata import version

    import flash_attn.cute  # noqa: F401
    import torch

    declared = (cache / GRID_FILE).is_file()
    targets = ", ".join(f"{t.name} ({t.compile_target}, {t.sms} SMs)" for t in compiled_for(cache))
    held = f"{kernels_in(cache)} kernels compiled ahead" + (f" for {targets}" if targets else "") + f" in {cache}"
    said = held if declared else "no kernels compiled ahead"
    return f"flash-attn-4 {version('flash-attn-4')} imports next to torch {torch.__version__} ({said})"


def check_cases() -> list[CaseResult]:
    """The grid the image's cache was compiled for (the default where it has none), each call
    compared with a reference and, where the cache declares the grid, required to compile nothing."""
    cache = prepare_check()
    declared = (cache / GRID_FILE).is_file()
    grid = Fa4Grid.from_json((cache / GRID_FILE).read_text()) if declared else Fa4Grid()
    import torch

    results, calls = cases(cache, grid, torch.cuda.get_device_capability(0)[0])
    seconds = sum(c.seconds for c in calls)
    compiles = sum(c.compiles for c in calls)
    said = f"{compiles} kernels compiled at the first calls, {seconds:.2f} s for the grid's {len(calls)} calls"
    bound = 0 if declared else float("inf")  # an image's declared grid compiles nothing
    return [*results, CaseResult("first calls", compiles, bound, said=said)]


def kernel_code() -> tuple[set[str], set[str]] | None:
    """The archs the image's cache was compiled for, as cubins are read ('90a': 9.0 only), for the
    check's arch verdict; None where it records none (every call then compiles at first use)."""
    cache = configured_cache()
    targets = compiled_for(cache) if cache else []
    return ({t.compile_target.removeprefix("sm_") for t in targets}, set()) if targets else None


# --- its build steps (steps.Steps): no wheel; its kernels compiled ahead, into its image ------------

LABEL = re.compile(r"(?!)")  # it makes no wheel, so no +label
FLAGS: tuple[str, ...] = ()


def label(local: str) -> re.Match[str] | None:
    return None


def _no_wheel(version: str | None) -> UsageError:
    return UsageError(
        f"flash-attn {version} is FlashAttention-4: Python, with no wheel to compile",
        hint="`fa4-cache` compiles its kernels ahead of their first call",
    )


def from_flags(args: argparse.Namespace) -> tuple[dict[str, Any] | None, tuple[str, ...]]:
    raise _no_wheel(args.flash_attn)


def prepare_source(request: SourceRequest, torch: TorchInfo) -> PreparedSource:
    raise _no_wheel(request.version)


def setup_command(python: str, src: Path, dist: Path, settings_file: Path) -> list[str]:
    raise _no_wheel(None)


def setup_environment(settings: BuildSettings, nvcc: NvccInfo) -> dict[str, str]:
    raise _no_wheel(settings.flash_attn)


def add_wheel_flags(parser: argparse.ArgumentParser) -> None:
    """It makes no wheel: no flags of ``wheel``."""


def check_wheel(report: Any, wheel: Wheel) -> None:
    """It makes no wheel."""


def check_label(report: Any, label: re.Match[str] | None, torch_here: dict) -> None:
    """It makes no wheel."""


def add_commands(sub: argparse._SubParsersAction) -> None:
    """``fa4-cache``: its kernels for a grid of calls, compiled ahead with no GPU."""
    cache = sub.add_parser(
        "fa4-cache",
        help="compile FlashAttention-4's kernels for a grid of calls ahead of time, with no GPU",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cache.add_argument("--out", type=Path, required=True, metavar="DIR", help="the cache (FA4's CUTE_DSL cache dir)")
    cache.add_argument(
        "--target",
        required=True,
        type=_target,
        metavar="NAME:CAPABILITY:SMS",
        help="the GPU to compile for: its name, compute capability and SM count (e.g. H100:9.0:132, as the "
        "compat table's gpus: give them); FA4 reads it when it is imported, so one run compiles for one "
        "GPU: run again, into the same DIR, for another",
    )
    defaults = Fa4Grid()
    cache.add_argument(
        "--head-dims", type=argtypes.ints, default=defaults.head_dims, metavar="LIST", help="default: 64,128"
    )
    cache.add_argument(
        "--dtypes", type=argtypes.names, default=defaults.dtypes, metavar="LIST", help="bf16, fp16 (default: bf16)"
    )
    cache.add_argument(
        "--kv-heads", type=argtypes.ints, default=defaults.kv_heads, metavar="LIST", help="default: 16,4"
    )
    cache.add_argument(
        "--heads", type=argtypes.positive, default=defaults.heads, metavar="N", help="query heads (default: 16)"
    )
    cache.add_argument("--batch", type=argtypes.positive, default=defaults.batch, metavar="N", help="default: 2")
    cache.add_argument("--seqlen", type=argtypes.positive, default=defaults.seqlen, metavar="N", help="default: 2048")
    cache.add_argument(
        "--causal", type=argtypes.bools, default=defaults.causal, metavar="LIST", help="false, true or both (default)"
    )
    cache.add_argument(
        "--modes", type=argtypes.names, default=defaults.modes, metavar="LIST", help="train, infer (default: both)"
    )
    cache.set_defaults(func=_cache_command)


def _target(text: str) -> Fa4Target:
    try:
        return Fa4Target.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cache_command(args: argparse.Namespace) -> int:
    grid = Fa4Grid(
        head_dims=args.head_dims,
        dtypes=args.dtypes,
        kv_heads=args.kv_heads,
        heads=args.heads,
        batch=args.batch,
        seqlen=args.seqlen,
        causal=args.causal,
        modes=args.modes,
    )
    warm(grid, args.out.resolve(), target=args.target, log=_say)
    return 0


def _say(line: str) -> None:
    print(untrusted.shown(line, keep_newlines=True), file=sys.stderr, flush=True)
