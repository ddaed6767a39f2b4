"""What both GPU checks share: one comparison's result, and the reference attention (torch's SDPA)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CaseResult:
    name: str
    err: float
    bound: float
    said: str | None = None  # what the line says instead of the error and its bound

    @property
    def ok(self) -> bool:
        return self.err <= self.bound

    def line(self) -> str:
        what = self.said if self.said is not None else f"max|err| {self.err:.2e} <= {self.bound:.2e}"
        return f"  {'✓' if self.ok else '✕'} {self.name}: {what}"


def sdpa(qkv, causal: bool):
    q, k, v = qkv
    import torch.nn.functional as F

    # flash-attn is (batch, seqlen, heads, dim); SDPA wants (batch, heads, seqlen, dim).
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
    return out.transpose(1, 2)
