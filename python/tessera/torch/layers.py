"""A Llama-style decoder layer, tensor parallel with sequence parallelism, built from the tessera modules.

    x [M/R, H] -> RMSNorm -> QKV (ColumnParallelLinear: AG+GEMM) -> RoPE -> causal attention on this rank's
    heads (SDPA) -> O (RowParallelLinear: GEMM+RS) -> + x -> RMSNorm -> TensorParallelMLP -> + -> [M/R, H]

One sequence of M tokens (batch 1); rank r holds tokens [r·ceil(M/R), ...). Query heads and KV heads are split
over the group (heads % R == 0, kv_heads % R == 0). The RMSNorm weights are replicated and see only this
rank's tokens: their gradients are partial sums, to be all-reduced over the group (they carry
`sequence_parallel = True`, as in Megatron; allreduce_sequence_parallel_grads() does it).
"""
import torch
import torch.nn.functional as F
from torch import nn

from .modules import ColumnParallelLinear, RowParallelLinear, TensorParallelMLP, _divide


def rms_norm(x, weight, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def rope(x, theta=500000.0):
    """Rotary embedding (rotate-half form) of x [heads, M, d] at positions 0..M-1."""
    d, m = x.shape[-1], x.shape[-2]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = torch.arange(m, device=x.device, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = torch.cat((ang.cos(), ang.cos()), -1), torch.cat((ang.sin(), ang.sin()), -1)
    x1, x2 = x.float()[..., : d // 2], x.float()[..., d // 2:]
    return (x.float() * cos + torch.cat((-x2, x1), -1) * sin).to(x.dtype)


def attention(q, k, v):
    """Causal attention: q [hq, M, d], k and v [hkv, M, d] (GQA: each KV head serves hq / hkv query heads)."""
    rep = q.shape[0] // k.shape[0]
    if rep > 1:
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
    return F.scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), is_causal=True)[0]


class TensorParallelDecoderLayer(nn.Module):
    def __init__(self, hidden, intermediate, heads, kv_heads, context, eps=1e-5, dtype=torch.bfloat16, device=None,
                 strategy="automatic"):
        super().__init__()
        self.context, self.hidden, self.eps = context, hidden, eps
        if hidden % heads:
            raise ValueError(f"hidden = {hidden} is not divisible by heads = {heads}")
        self.head_dim = hidden // heads
        self.heads_local = _divide(heads, context.world, "heads")
        self.kv_local = _divide(kv_heads, context.world, "kv_heads")
        self.heads, self.kv_heads = heads, kv_heads
        device = context.device if device is None else device
        kw = dict(dtype=dtype, device=device, strategy=strategy)
        self.qkv = ColumnParallelLinear(hidden, (heads + 2 * kv_heads) * self.head_dim, context, bias=False, **kw)
        self.o = RowParallelLinear(heads * self.head_dim, hidden, context, bias=False, **kw)
        self.mlp = TensorParallelMLP(hidden, intermediate, context, **kw)
        self.ln1 = nn.Parameter(torch.ones(hidden, dtype=dtype, device=device))
        self.ln2 = nn.Parameter(torch.ones(hidden, dtype=dtype, device=device))
        self.ln1.sequence_parallel = self.ln2.sequence_parallel = True

    @torch.no_grad()
    def load_full(self, wq, wk, wv, wo, w_gate, w_up, w_down, ln1=None, ln2=None):
        """This rank's parts of full nn.Linear weights: q [heads·d, H], k and v [kv_heads·d, H], o [H, heads·d],
        gate and up [I, H], down [H, I]."""
        r, d = self.context.rank, self.head_dim
        q_rows, kv_rows = self.heads_local * d, self.kv_local * d
        self.qkv.weight.copy_(torch.cat((wq[r * q_rows:(r + 1) * q_rows], wk[r * kv_rows:(r + 1) * kv_rows],
                                         wv[r * kv_rows:(r + 1) * kv_rows])))
        self.o.load_full(wo)
        self.mlp.load_full(w_gate, w_up, w_down)
        if ln1 is not None:
            self.ln1.copy_(ln1)
        if ln2 is not None:
            self.ln2.copy_(ln2)
        return self

    def forward(self, x, m=None):
        """x [M/R, hidden] (this rank's tokens) -> [M/R, hidden]; m: total tokens (default x's rows × R)."""
        m = x.shape[0] * self.context.world if m is None else m
        d, hq, hkv = self.head_dim, self.heads_local, self.kv_local
        qkv = self.qkv(rms_norm(x, self.ln1, self.eps), m=m)  # [M, (hq + 2 hkv) d]
        q = qkv[:, : hq * d].reshape(m, hq, d).transpose(0, 1)
        k = qkv[:, hq * d:(hq + hkv) * d].reshape(m, hkv, d).transpose(0, 1)
        v = qkv[:, (hq + hkv) * d:].reshape(m, hkv, d).transpose(0, 1)
        a = attention(rope(q), rope(k), v)  # [hq, M, d]
        x = x + self.o(a.transpose(0, 1).reshape(m, hq * d))
        return x + self.mlp(rms_norm(x, self.ln2, self.eps), m=m)

    def allreduce_sequence_parallel_grads(self):
        """Sums the RMSNorm weights' gradients over the context's group (each rank saw only its tokens)."""
        if self.context.world == 1:
            return
        import torch.distributed as dist
        for p in (self.ln1, self.ln2):
            if p.grad is not None:
                dist.all_reduce(p.grad, group=self.context.group)


__all__ = ["TensorParallelDecoderLayer", "rms_norm", "rope", "attention"]
