"""FlashAttention-3's GPU check: forward and backward against a reference, by FA3's own rule.

Only what the wheel was built with is run (its ``flash_attn_config``: head dims, fp16, backward).
The rule is hopper/test_flash_attn.py's: the reference is attention computed in fp32 and rounded
to the input dtype; FA3 passes where its error is at most twice that of the same math run in the
input dtype, plus twice the dtype's rounding at the reference's magnitude.
"""

from __future__ import annotations

from ..comparison import CaseResult, sdpa
from . import fa3

REFERENCE = "an fp32 reference (FA3's rule)"  # what its cases compare with, for the verdict line
RULE = (
    "max|err| <= 2 x max|err| of the same math in the input dtype"
    " + 2 x the dtype's rounding at the reference's magnitude"
)
SHAPE = (2, 1024, 8)  # batch, seqlen, query heads
GQA_KV_HEADS = 2  # one grouped-query case: 8 query heads over 2 KV heads


def installed_build() -> fa3.Fa3Build:
    """What the installed wheel compiled, from its own record (flash_attn_config, a plain module)."""
    from flash_attn_config import CONFIG  # type: ignore[import-not-found]

    return fa3.Fa3Build.from_config(CONFIG)


def import_check() -> str:
    """Imports FA3's extension (its operators register with torch) and its interface; needs no GPU."""
    import importlib

    import torch

    extension_file()  # after torch, whose libraries (libc10) it links; an undefined symbol fails here
    importlib.import_module("flash_attn_interface")

    return f"flash_attn_3 imports next to torch {torch.__version__} (built: {installed_build().describe()})"


def kernel_code() -> tuple[set[str], set[str]]:
    """The attention kernels' cubins, as its build record says: sm_90a (9.0 only), and sm_80 unless
    left out. Its ELF says less: an "a" variant reads as plain 90 there (no cuobjdump in an image),
    and its scheduler carries sm_80 even where the attention kernels leave it out."""
    return set(installed_build().archs), set()


def extension_file() -> str:
    """The extension's file, imported after torch: it links torch's libraries (libc10)."""
    import importlib

    import torch  # noqa: F401

    return str(importlib.import_module("flash_attn_3._C").__file__)


def _rule(name: str, out, ref, low, dtype) -> CaseResult:
    """FA3's tolerance: |out-ref| <= 2 |low-ref| + 2 * rounding(ref), with ref rounded to ``dtype``."""
    ref_low = ref.to(dtype)
    rounding = 2 * (ref_low + 0.3 - 0.3 - ref_low).abs().max().item()
    ref_f = ref_low.float()
    err = (out.float() - ref_f).abs().max().item()
    err_low = (low.float() - ref_f).abs().max().item()
    return CaseResult(name, err, 2 * err_low + rounding)


def _grouped(t, groups: int):
    return t.repeat_interleave(groups, dim=2) if groups > 1 else t


def case(dtype, head_dim: int, *, causal: bool, kv_heads: int, backward: bool) -> list[CaseResult]:
    import torch
    from flash_attn_interface import flash_attn_func  # type: ignore[import-not-found]

    batch, seqlen, heads = SHAPE
    groups = heads // kv_heads
    torch.manual_seed(0)
    q = torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=dtype, requires_grad=True)
    k, v = (
        torch.randn(batch, seqlen, kv_heads, head_dim, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2)
    )
    ref_in = [t.detach().float().requires_grad_() for t in (q, k, v)]
    low_in = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = flash_attn_func(q, k, v, causal=causal)
    ref = sdpa([ref_in[0], _grouped(ref_in[1], groups), _grouped(ref_in[2], groups)], causal)
    low = sdpa([low_in[0], _grouped(low_in[1], groups), _grouped(low_in[2], groups)], causal)
    dn = str(dtype).removeprefix("torch.")
    tag = f"{dn} hdim {head_dim} {'causal' if causal else 'full'}" + (f" GQA {heads}/{kv_heads}" if groups > 1 else "")
    results = [_rule(f"forward {tag}", out, ref, low, dtype)]
    if backward:
        grad = torch.randn_like(out)
        for t, g in ((out, grad), (ref, grad.float()), (low, grad)):
            t.backward(g)
        for name, a, r, lo in zip("qkv", (q, k, v), ref_in, low_in):
            results.append(_rule(f"d{name} {tag}", a.grad, r.grad, lo.grad, dtype))
    return results


def cases(build: fa3.Fa3Build) -> list[CaseResult]:
    """One case per built head dim and half dtype, causal and not, and one grouped-query case."""
    import torch

    dtypes = [torch.bfloat16] + ([torch.float16] if "fp16" in build.dtypes else [])
    backward = "backward" not in build.without
    results: list[CaseResult] = []
    for head_dim in build.head_dims:
        for dtype in dtypes:
            for causal in (False, True):
                results += case(dtype, head_dim, causal=causal, kv_heads=SHAPE[2], backward=backward)
    results += case(dtypes[0], build.head_dims[0], causal=True, kv_heads=GQA_KV_HEADS, backward=backward)
    return results


def check_cases() -> list[CaseResult]:
    """The cases of the build installed here, by what it was built with."""
    return cases(installed_build())
