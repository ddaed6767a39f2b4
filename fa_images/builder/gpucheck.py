"""The check every image runs: does flash-attn import, and does it compute attention right?

Forward and backward of ``flash_attn_func`` in fp16 and bf16, causal and not, and one
``flash_attn_varlen_func``, each compared with torch's ``scaled_dot_product_attention``.
The reference is computed in fp32; flash-attn passes when its error is within twice the
error of SDPA run in the same low precision, plus a small absolute slack (the rule
flash-attn's own tests use).

Before any kernel runs, the GPU's compute capability is compared with the code the installed
extension carries (``gpuarch``): a GPU that can run none of it is the wrong place to check the
wheel, not a broken wheel. Exit codes: 0 pass, 1 a failure, 3 no GPU here, 8 wrong arch (this
GPU cannot run the extension's code; it names the archs that can).
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from . import generations
from .comparison import CaseResult, sdpa
from .contract import EXIT_NO_GPU, EXIT_WRONG_ARCH, WRONG_ARCH_PREFIX
from .verdict import Case, Verdict, driver_release

EXIT_FAILED = 1

ATOL = {"float16": 1e-3, "bfloat16": 8e-3}  # slack over 2x SDPA's own low-precision error
RULE = "max|err| <= 2 x max|err| of SDPA in the same dtype + atol (float16 1e-3, bfloat16 8e-3), against fp32 SDPA"


# Modules users import beyond the top level; they need flash-attn's runtime dependencies
# (einops), which a `--no-deps` install would leave out.
IMPORTED_MODULES = ("flash_attn.bert_padding", "flash_attn.layers.rotary", "flash_attn.modules.mha")


def import_check() -> str:
    """Imports flash_attn, its extension and its common modules: catches undefined symbols
    and missing runtime dependencies, needs no GPU."""
    import importlib

    import flash_attn
    import flash_attn_2_cuda  # noqa: F401  (the compiled part; an ABI mismatch fails here)
    import torch

    for name in IMPORTED_MODULES:
        importlib.import_module(name)
    return (
        f"flash_attn {flash_attn.__version__} imports next to torch {torch.__version__} "
        f"(with {', '.join(m.removeprefix('flash_attn.') for m in IMPORTED_MODULES)})"
    )


def _bound(err_low: float, dtype_name: str) -> float:
    return 2 * err_low + ATOL[dtype_name]


def _compare(name: str, out, ref, low, dtype_name: str) -> CaseResult:
    err = (out.float() - ref).abs().max().item()
    err_low = (low.float() - ref).abs().max().item()
    return CaseResult(name, err, _bound(err_low, dtype_name))


def dense_cases(shape=(2, 1024, 16, 128)) -> list[CaseResult]:
    import torch
    from flash_attn import flash_attn_func

    results = []
    for dtype in (torch.float16, torch.bfloat16):
        for causal in (False, True):
            torch.manual_seed(0)
            q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
            grad = torch.randn(shape, device="cuda", dtype=dtype)
            ref_in = [t.detach().float().requires_grad_() for t in (q, k, v)]
            low_in = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            out = flash_attn_func(q, k, v, causal=causal)
            ref = sdpa(ref_in, causal)
            low = sdpa(low_in, causal)
            for t, g in ((out, grad), (ref, grad.float()), (low, grad)):
                t.backward(g)
            tag = f"{str(dtype).removeprefix('torch.')} {'causal' if causal else 'full'}"
            dn = str(dtype).removeprefix("torch.")
            results.append(_compare(f"forward {tag}", out, ref, low, dn))
            for name, a, r, lo in zip("qkv", (q, k, v), ref_in, low_in):
                results.append(_compare(f"d{name} {tag}", a.grad, r.grad, lo.grad, dn))
    return results


def varlen_case(seqlens=(300, 724), heads=8, dim=64) -> CaseResult:
    import torch
    from flash_attn import flash_attn_varlen_func

    torch.manual_seed(0)
    total = sum(seqlens)
    q, k, v = (torch.randn(total, heads, dim, device="cuda", dtype=torch.float16) for _ in range(3))
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
    out = flash_attn_varlen_func(q, k, v, cu, cu, max(seqlens), max(seqlens), causal=True)
    errs, low_errs = [], []
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist()):
        sl = [t[start:end].unsqueeze(0) for t in (q, k, v)]
        ref = sdpa([t.float() for t in sl], True)[0]
        low = sdpa(sl, True)[0]
        errs.append((out[start:end].float() - ref).abs().max().item())
        low_errs.append((low.float() - ref).abs().max().item())
    return CaseResult(f"varlen float16 causal, seqlens {list(seqlens)}", max(errs), _bound(max(low_errs), "float16"))


def installed() -> list[generations.Generation]:
    """The flash-attn generations installed here: by their distributions' metadata, or, without
    one (a source tree on the path), by the module only each of them has, found without importing it."""
    import importlib.metadata
    import importlib.util

    found = []
    for gen in generations.GENERATIONS:
        try:
            importlib.metadata.distribution(gen.project)
        except importlib.metadata.PackageNotFoundError:
            if gen.own_module is None or importlib.util.find_spec(gen.own_module) is None:
                continue
        found.append(gen)
    return found


def extension_code(extension: str) -> tuple[set[str], set[str]] | None:
    """(cubin archs, PTX archs) of an installed extension, as its ELF says; None when they cannot be read."""
    from pathlib import Path

    from . import verify

    try:
        cubins, ptx, _how = verify.gpu_archs(Path(extension))
    except (OSError, ValueError) as exc:  # elf.ElfError is a ValueError
        print(f"note: {extension}: {exc}", file=sys.stderr)
        return None
    return (cubins, ptx) if cubins or ptx else None


def arch_verdict(capability, code: tuple[set[str], set[str]] | None):
    """``gpuarch.verdict`` for the extension's cubins and PTX, or None when they are not known."""
    from . import gpuarch

    if code is None:
        return None
    return gpuarch.verdict(code[0], code[1], (int(capability[0]), int(capability[1])))


@dataclass(frozen=True)
class Checks:
    """What the check runs for one generation: its import, its extension's file, its cases."""

    generation: generations.Generation
    import_check: Callable[[], str]
    code: Callable[[], tuple[set[str], set[str]] | None]  # the attention kernels' (cubins, PTX)
    cases: Callable[[], list[CaseResult]]
    what: str  # the reference the cases compare with, for the verdict line
    rule: str  # its tolerance rule, in words, for the signed verdict


def checks_for(gen: generations.Generation) -> Checks:
    """A generation's checks: its own check module's (imported here, as it imports torch), else
    flash-attn 2's, which are this module's."""
    if gen.check_module is not None:
        module = importlib.import_module(gen.check_module, generations.__name__)
        return Checks(gen, module.import_check, module.kernel_code, module.check_cases, module.REFERENCE, module.RULE)

    def code() -> tuple[set[str], set[str]] | None:
        import flash_attn_2_cuda

        return extension_code(flash_attn_2_cuda.__file__)

    return Checks(gen, import_check, code, lambda: dense_cases() + [varlen_case()], "SDPA", RULE)


def run(*, import_only: bool = False, out=print) -> int:
    gens = installed()
    if not gens:
        projects = ", ".join(g.project for g in generations.GENERATIONS)
        out(f"FAIL: import: no flash-attn is installed here (none of {projects})")
        return EXIT_FAILED
    codes = [run_one(checks_for(gen), import_only=import_only, out=out) for gen in gens]
    # The worst verdict: a failure over a wrong arch over no GPU over a pass.
    for code in (EXIT_FAILED, EXIT_WRONG_ARCH, EXIT_NO_GPU):
        if code in codes:
            return code
    return max(codes)


def run_one(checks: Checks, *, import_only: bool = False, out=print) -> int:
    try:
        out(checks.import_check())
    except Exception as exc:  # any import failure is the verdict, not a crash
        out(f"FAIL: import: {type(exc).__name__}: {exc}")
        return EXIT_FAILED
    if import_only:
        out("PASS: import check (no GPU check requested)")
        return 0
    import torch

    try:  # a GPU that is visible but busy, lost or in a bad state raises here: a verdict, not a crash
        if not torch.cuda.is_available():
            out("NO GPU: torch sees no CUDA device; the GPU check was not run (import check passed)")
            return EXIT_NO_GPU
        capability = tuple(torch.cuda.get_device_capability(0))
        device = torch.cuda.get_device_name(0)
    except Exception as exc:
        out(f"NO GPU: the GPU cannot be used ({type(exc).__name__}: {str(exc)[:300]}); the GPU check was not run")
        return EXIT_NO_GPU
    started = time.monotonic()
    out(f"GPU: {device} (sm_{''.join(map(str, capability))})")
    arch = arch_verdict(capability, checks.code())
    if arch is None:
        out("GPU code: no compiled extension's archs to read (or unreadable); running the kernels to find out")
    elif not arch.runs:
        out(f"{WRONG_ARCH_PREFIX}{arch.line()}; no kernel was run")
        return EXIT_WRONG_ARCH
    else:
        out(f"GPU code: {arch.line()}")
    try:
        results = checks.cases()
    except Exception as exc:
        out(f"FAIL: {type(exc).__name__}: {exc}")
        return EXIT_FAILED
    for r in results:
        out(r.line())
    failed = [r for r in results if not r.ok]
    seconds = time.monotonic() - started
    name = checks.generation.name
    verdict = Verdict(
        generation=name,
        passed=not failed,
        gpu=device,
        capability=f"{capability[0]}.{capability[1]}",
        driver=driver_release(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        reference=checks.what,
        rule=checks.rule,
        cases=tuple(Case.of(r) for r in results),
        seconds=round(seconds, 2),
    )
    out(verdict.line())
    if failed:
        out(f"FAIL: {name}: {len(failed)} of {len(results)} comparisons out of tolerance ({seconds:.1f} s)")
        return EXIT_FAILED
    out(f"PASS: {name}: {len(results)} comparisons with {checks.what} within tolerance ({seconds:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(run(import_only="--import-only" in sys.argv))
