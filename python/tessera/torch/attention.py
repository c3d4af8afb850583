"""Sequence-parallel attention over zig-zag shards: tessera.torch.sp_attention and the shard helpers.

    q_s, k_s, v_s = (tt.zigzag_shard(t, ctx.world, ctx.rank) for t in (q, k, v))   # [B, S, H, D] -> [B, S/R, H, D]
    o_s = tt.sp_attention(q_s, k_s, v_s, ctx, causal=True)                           # this rank's rows of O
    o = tt.zigzag_unshard([o_s of every rank])                                        # back to global order

The global sequence of S tokens is cut into 2R chunks; rank r holds chunks r and 2R−1−r, so under a causal mask
every rank does the same work. The op gathers K and V from the other ranks (torch.ops.tessera.sp_attention, on
the current stream).
"""
import ctypes

import torch

from .. import _lib
from ._context import STRATEGIES, strategy_code
from ._ops import _DTYPES, _check_tensors, _sp_shapes


def sp_attention(q, k, v, ctx, causal=True, softmax_scale=None, strategy="automatic", return_lse=False):
    """Attention of this rank's zig-zag shard q [B, 2C, Hq, D] against the whole sequence's K and V, whose shards
    k, v [B, 2C, Hkv, D] every rank of `ctx` passes at the same time (collective). Returns O [B, 2C, Hq, D] (and
    with return_lse, LSE [B, Hq, 2C] float32, natural log). softmax_scale None: 1/sqrt(D).

    CUDA graphs: sequential, fused_ce and automatic can be captured (torch.cuda.graph) after one eager call of the
    same shapes on the same context; automatic then runs the choice made eagerly (sequential where that choice
    cannot be captured). ring, ulysses and two_level are refused inside a capture."""
    code = strategy_code(strategy)
    scale = 0.0 if softmax_scale is None else float(softmax_scale)
    if return_lse:
        return torch.ops.tessera.sp_attention_lse(q, k, v, ctx.handle, causal, scale, code)
    return torch.ops.tessera.sp_attention(q, k, v, ctx.handle, causal, scale, code)


def resolve_sp_attention(q, k, v, ctx, causal=True):
    """The strategy name `automatic` runs for these shards (collective). A shape never measured is measured now,
    whatever the context's tune_on_miss says, and the choice cached: call it before a training or serving loop so
    that automatic never stops inside it."""
    _check_tensors("sp_attention", ctx, True, ndim=4, q=q, k=k, v=v)
    b, rows, hq, hkv, d = _sp_shapes("sp_attention", q, k, v, 0.0, 0)
    session = ctx.session
    out = ctypes.c_int()
    lib = _lib.load()
    _lib.check(lib.tessera_sp_attention_resolve(session, q.data_ptr(), k.data_ptr(), v.data_ptr(), q.data_ptr(), b,
                                                rows * ctx.world, hq, hkv, d, _DTYPES[q.dtype], 1 if causal else 0,
                                                ctypes.byref(out)))
    return {code: name for name, code in STRATEGIES.items()}[out.value]


def _chunk(n, world, dim):
    if world < 1 or n % (2 * world) != 0 or n == 0:
        raise ValueError(f"zig-zag sharding: length {n} along dim {dim} must be a positive multiple of 2 x world = "
                         f"{2 * world}")
    return n // (2 * world)


def zigzag_shard(x, world, rank, dim=1):
    """Rank `rank`'s zig-zag shard of the global tensor x along `dim`: chunks rank and 2·world−1−rank of 2·world."""
    if not 0 <= rank < world:
        raise ValueError(f"zig-zag sharding: rank {rank} outside [0, {world})")
    c = _chunk(x.shape[dim], world, dim)
    return torch.cat([x.narrow(dim, rank * c, c), x.narrow(dim, (2 * world - 1 - rank) * c, c)], dim=dim)


def zigzag_unshard(shards, dim=1):
    """The global tensor from every rank's zig-zag shard (shards[r] from rank r), the inverse of zigzag_shard."""
    world = len(shards)
    c = _chunk(shards[0].shape[dim] * world, world, dim)
    chunks = [None] * (2 * world)
    for r, s in enumerate(shards):
        chunks[r], chunks[2 * world - 1 - r] = s.narrow(dim, 0, c), s.narrow(dim, c, c)
    return torch.cat(chunks, dim=dim)
