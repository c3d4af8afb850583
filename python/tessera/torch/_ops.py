"""torch.library custom ops tessera::ag_gemm, ag_gemm_gathered, gemm_rs, gemm_ar, mlp, transpose, swiglu,
swiglu_backward, sp_attention, sp_attention_lse, moe_tp, moe_ep, moe_topk.

Each takes the context's integer handle (tessera.torch.Context.handle) and a strategy code, validates its
arguments before anything is launched (ValueError / TypeError naming the argument), has a fake (meta)
implementation for torch.compile and FakeTensor tracing, and runs on the caller's current CUDA stream: the
library orders the operator inside that stream (an event each way), so the inputs are ready when it starts,
the caller's later work — including the caching allocator's reuse of freed inputs, which is ordered on that
same stream — follows it, and no record_stream is needed. Outputs are allocated on the current stream.

Shapes (B [N, K], the nn.Linear weight layout, unless b_kn; all row-major, contiguous, bf16 or fp16):
  ag_gemm(a[m_local, K], b[N, K], ctx, m, swiglu, strategy) -> [m, N] (or [m, N/2] with swiglu: b holds gate
      and up rows interleaved, out = SiLU(gate) * up)
  ag_gemm_gathered(a, b, ctx, m, swiglu, strategy, b_kn) -> (the same, the gathered a [m, K]); b_kn: b is [K, N]
      and out = all_gather(a) @ b (N a multiple of 8; not with swiglu)
  gemm_rs(a[M, K], b[N, K], ctx, strategy, b_kn) -> [m_local, N]: this rank's rows of reduce_scatter(a @ b.T);
      b_kn: b is [K, N] and the product a @ b (N a multiple of 8)
  (b_kn lets the backward pass the nn.Linear weight W [N_out, K_in] itself for dX = dY @ W, no transposed copy)
  gemm_ar(a[M, K], b[N, K], ctx, strategy) -> [M, N]: all_reduce(a @ b.T)
  mlp(x[m_local, H], w_gate_up[2I, H], w_down[H, I], ctx, m, ag_strategy, rs_strategy) -> [m_local, H]
  transpose(w[R, C]) -> [C, R] contiguous (a tiled kernel)
  swiglu(gu[M, 2I]) -> h[M, I] = SiLU(gu[:, 0::2]) * gu[:, 1::2] (gate/up interleaved; no context)
  swiglu_backward(gu[M, 2I], dh[M, I]) -> (dgu[M, 2I], h[M, I]): one pass, h recomputed for the weight gradient
  (transpose, swiglu and swiglu_backward also take CPU tensors: the reference math, so the modules run at TP = 1
  on the CPU)
Row shards follow ceil(M / world) rows per rank, the last ones shorter.

Sequence-parallel attention (4-D BSHD tensors, contiguous; head_dim 64 or 128; heads_q a multiple of heads_kv):
  sp_attention(q[B, 2C, Hq, D], k[B, 2C, Hkv, D], v, ctx, causal, softmax_scale, strategy) -> o[B, 2C, Hq, D]
  sp_attention_lse(...) -> (o, lse[B, Hq, 2C] float32, natural log)
over zig-zag shards: the global sequence of 2C·world tokens is cut into 2·world chunks of C, and rank r holds chunks
r and 2·world−1−r, in that order (tessera.torch.zigzag_shard). softmax_scale 0: 1/sqrt(D). Strategies: automatic
(0), sequential (1), fused_ce (3), ring (5), ulysses (6), two_level (8).

Mixture-of-Experts layers (bf16; routing int32 ids and float32 gate weights [T_local, topk] of this rank's tokens;
per expert y = w_down · (SiLU(gate) · up) with [gate, up] = w_gate_up · x, gate/up rows interleaved as fuse_gate_up
makes them, and out = Σ over the topk slots of weight · y; strategies automatic (0), sequential (1), pipelined (7)):
  moe_tp(x[T_local, H], expert_ids, weights, w_gate_up[E, 2·I_local, H], w_down[E, H, I_local], ctx, strategy)
      -> [T_local, H]: tensor parallel, every rank holds every expert's I / world shard (ops::moe_tp)
  moe_ep(x[T_local, H], expert_ids, weights, w_gate_up[E/world, 2·I, H], w_down[E/world, H, I], ctx, capacity,
         strategy) -> [T_local, H]: expert parallel, rank r owns experts [r·E/world, (r+1)·E/world) (ops::moe_ep);
      capacity: rows per destination rank (0: T_local·topk, no overflow possible)
  moe_topk(logits[T, E] float32/bf16/fp16, k, renormalize) -> (expert_ids[T, k] int32, weights[T, k] float32): the
      router (softmax, the k largest, slots by descending weight; no context)
An expert id outside [0, E) or rows over moe_ep's capacity are left out on the device and reported by
Context.moe_tp_check_status() / moe_ep_check_status() (which wait for the stream), never silently. These ops have
no autograd formula: a backward through them raises (forward only).
"""
import torch

from .. import _lib
from ._context import lookup, shard_rows

_DTYPES = {torch.bfloat16: 0, torch.float16: 1}
Tensor = torch.Tensor


def _need(cond, msg, exc=ValueError):
    if not cond:
        raise exc(msg)


def _check_tensors(op, ctx, device_check, ndim=2, **ts):
    """ndim-D, one dtype (bf16/fp16), contiguous; on the context's device when device_check."""
    dtype = None
    for name, t in ts.items():
        _need(t.dim() == ndim, f"tessera::{op}: {name} must be {ndim}-D, got shape {tuple(t.shape)}")
        _need(t.dtype in _DTYPES, f"tessera::{op}: {name} has dtype {t.dtype}; bf16 or fp16 only", TypeError)
        if dtype is None:
            dtype, first = t.dtype, name
        _need(t.dtype == dtype, f"tessera::{op}: {name} has dtype {t.dtype} but {first} has {dtype}", TypeError)
        _need(t.is_contiguous(), f"tessera::{op}: {name} must be contiguous (row-major), got strides {t.stride()}")
        if device_check:
            _need(t.device == ctx.device,
                  f"tessera::{op}: {name} is on {t.device}, but the context's device is {ctx.device}")
    return dtype


def _check_aligned(op, **ts):
    """16-byte aligned data (the kernels' TMA descriptors and vector loads); a view at an odd storage offset is not."""
    for name, t in ts.items():
        _need(t.data_ptr() % 16 == 0, f"tessera::{op}: {name} is not 16-byte aligned (storage offset "
                                      f"{t.storage_offset()}); pass a tensor of its own (.clone())")


def _b_nk(op, a, b, b_kn):
    """(N, K) of b: [N, K], or [K, N] with b_kn; checks K against a's and, for b_kn, N's 16-byte rows."""
    n, k = (b.shape[1], b.shape[0]) if b_kn else (b.shape[0], b.shape[1])
    if b_kn:
        _need(a.shape[1] == k, f"tessera::{op}: a has K = {a.shape[1]} but b (b_kn: [K, N]) has K = {k} rows")
        _need(n % 8 == 0, f"tessera::{op}: b_kn needs N a multiple of 8 (16-byte rows of b [K, N]); b has N = {n}")
    else:
        _need(a.shape[1] == k, f"tessera::{op}: a has K = {a.shape[1]} but b has K = {k}")
    return n, k


def _ag_shapes(op, ctx, a, b, m, swiglu, b_kn=False):
    _need(not (swiglu and b_kn), f"tessera::{op}: swiglu needs b as [N, K] (gate/up interleaved by rows); b_kn = True "
                                 "is not supported with it")
    n, _ = _b_nk(op, a, b, b_kn)
    _need(m >= 1, f"tessera::{op}: m = {m} (total rows) must be >= 1")
    _need(a.shape[0] == shard_rows(m, ctx.world, ctx.rank),
          f"tessera::{op}: a has {a.shape[0]} rows but rank {ctx.rank}'s shard of m = {m} over {ctx.world} ranks has "
          f"{shard_rows(m, ctx.world, ctx.rank)}")
    _need(not swiglu or n % 2 == 0, f"tessera::{op}: swiglu needs an even N, b has {n} rows")
    return n // 2 if swiglu else n


def _stream(ctx):
    return torch.cuda.current_stream(ctx.device).cuda_stream


# ---- ag_gemm / ag_gemm_gathered -------------------------------------------------------------------------------
def _ag_run(op, a, b, ctx_handle, m, swiglu, strategy, gathered, b_kn=False):
    ctx = lookup(ctx_handle)
    dt = _check_tensors(op, ctx, True, a=a, b=b)
    n_out = _ag_shapes(op, ctx, a, b, m, swiglu, b_kn)
    n, k = _b_nk(op, a, b, b_kn)
    out = torch.empty((m, n_out), dtype=a.dtype, device=a.device)
    g = torch.empty((m, a.shape[1]), dtype=a.dtype, device=a.device) if gathered else None
    lib = _lib.load()
    # The key of an NK call is as before; a [K, N] B adds a True (Context.pretune's shapes).
    strategy = ctx.strategy_for(("ag_gemm", m, n, k, bool(swiglu)) + ((True,) if b_kn else ()), strategy)
    flags = (_lib.AG_SWIGLU if swiglu else 0) | (_lib.B_KN if b_kn else 0)
    _lib.check(lib.tessera_ag_gemm_ex(ctx.session, _stream(ctx), a.data_ptr(), b.data_ptr(), out.data_ptr(),
                                      g.data_ptr() if gathered else None, m, a.shape[0], n, k, 0, _DTYPES[dt], flags,
                                      strategy))
    return out, g


@torch.library.custom_op("tessera::ag_gemm", mutates_args=(), device_types="cuda")
def ag_gemm(a: Tensor, b: Tensor, ctx: int, m: int, swiglu: bool = False, strategy: int = 0) -> Tensor:
    return _ag_run("ag_gemm", a, b, ctx, m, swiglu, strategy, False)[0]


@ag_gemm.register_fake
def _(a, b, ctx, m, swiglu=False, strategy=0):
    c = lookup(ctx)
    _check_tensors("ag_gemm", c, False, a=a, b=b)
    n_out = _ag_shapes("ag_gemm", c, a, b, m, swiglu)
    return a.new_empty((m, n_out))


@torch.library.custom_op("tessera::ag_gemm_gathered", mutates_args=(), device_types="cuda")
def ag_gemm_gathered(a: Tensor, b: Tensor, ctx: int, m: int, swiglu: bool = False, strategy: int = 0,
                     b_kn: bool = False) -> tuple[Tensor, Tensor]:
    return _ag_run("ag_gemm_gathered", a, b, ctx, m, swiglu, strategy, True, b_kn)


@ag_gemm_gathered.register_fake
def _(a, b, ctx, m, swiglu=False, strategy=0, b_kn=False):
    c = lookup(ctx)
    _check_tensors("ag_gemm_gathered", c, False, a=a, b=b)
    n_out = _ag_shapes("ag_gemm_gathered", c, a, b, m, swiglu, b_kn)
    return a.new_empty((m, n_out)), a.new_empty((m, a.shape[1]))


# ---- gemm_rs ---------------------------------------------------------------------------------------------------
def _rs_shapes(op, ctx, a, b, b_kn=False):
    _b_nk(op, a, b, b_kn)
    m_local = shard_rows(a.shape[0], ctx.world, ctx.rank)
    _need(m_local >= 1, f"tessera::{op}: a has {a.shape[0]} rows, leaving rank {ctx.rank} of {ctx.world} no rows")
    return m_local


@torch.library.custom_op("tessera::gemm_rs", mutates_args=(), device_types="cuda")
def gemm_rs(a: Tensor, b: Tensor, ctx: int, strategy: int = 0, b_kn: bool = False) -> Tensor:
    c = lookup(ctx)
    dt = _check_tensors("gemm_rs", c, True, a=a, b=b)
    m_local = _rs_shapes("gemm_rs", c, a, b, b_kn)
    n, k = _b_nk("gemm_rs", a, b, b_kn)
    out = torch.empty((m_local, n), dtype=a.dtype, device=a.device)
    lib = _lib.load()
    strategy = c.strategy_for(("gemm_rs", a.shape[0], n, k) + ((True,) if b_kn else ()), strategy)
    _lib.check(lib.tessera_gemm_rs_ex2(c.session, _stream(c), a.data_ptr(), b.data_ptr(), out.data_ptr(), a.shape[0],
                                       m_local, n, k, _DTYPES[dt], strategy, _lib.B_KN if b_kn else 0))
    return out


@gemm_rs.register_fake
def _(a, b, ctx, strategy=0, b_kn=False):
    c = lookup(ctx)
    _check_tensors("gemm_rs", c, False, a=a, b=b)
    m_local = _rs_shapes("gemm_rs", c, a, b, b_kn)
    return a.new_empty((m_local, b.shape[1] if b_kn else b.shape[0]))


# ---- gemm_ar ---------------------------------------------------------------------------------------------------
@torch.library.custom_op("tessera::gemm_ar", mutates_args=(), device_types="cuda")
def gemm_ar(a: Tensor, b: Tensor, ctx: int, strategy: int = 0) -> Tensor:
    c = lookup(ctx)
    dt = _check_tensors("gemm_ar", c, True, a=a, b=b)
    _need(a.shape[1] == b.shape[1], f"tessera::gemm_ar: a has K = {a.shape[1]} but b has K = {b.shape[1]}")
    out = torch.empty((a.shape[0], b.shape[0]), dtype=a.dtype, device=a.device)
    lib = _lib.load()
    strategy = c.strategy_for(("gemm_ar", a.shape[0], b.shape[0], b.shape[1]), strategy)
    _lib.check(lib.tessera_gemm_ar_ex(c.session, _stream(c), a.data_ptr(), b.data_ptr(), out.data_ptr(), a.shape[0],
                                      b.shape[0], b.shape[1], _DTYPES[dt], strategy))
    return out


@gemm_ar.register_fake
def _(a, b, ctx, strategy=0):
    _check_tensors("gemm_ar", lookup(ctx), False, a=a, b=b)
    _need(a.shape[1] == b.shape[1], f"tessera::gemm_ar: a has K = {a.shape[1]} but b has K = {b.shape[1]}")
    return a.new_empty((a.shape[0], b.shape[0]))


# ---- mlp -------------------------------------------------------------------------------------------------------
def _mlp_shapes(c, x, w_gate_up, w_down, m):
    h, i_local = x.shape[1], w_down.shape[1]
    _need(tuple(w_gate_up.shape) == (2 * i_local, h),
          f"tessera::mlp: w_gate_up is {tuple(w_gate_up.shape)}, expected {(2 * i_local, h)} (2·I_local, H)")
    _need(w_down.shape[0] == h, f"tessera::mlp: w_down has {w_down.shape[0]} rows, expected H = {h}")
    _need(x.shape[0] == shard_rows(m, c.world, c.rank),
          f"tessera::mlp: x has {x.shape[0]} rows but rank {c.rank}'s shard of m = {m} has "
          f"{shard_rows(m, c.world, c.rank)}")
    return h, i_local


@torch.library.custom_op("tessera::mlp", mutates_args=(), device_types="cuda")
def mlp(x: Tensor, w_gate_up: Tensor, w_down: Tensor, ctx: int, m: int, ag_strategy: int = 0,
        rs_strategy: int = 0) -> Tensor:
    c = lookup(ctx)
    dt = _check_tensors("mlp", c, True, x=x, w_gate_up=w_gate_up, w_down=w_down)
    h, i_local = _mlp_shapes(c, x, w_gate_up, w_down, m)
    out = torch.empty_like(x)
    lib = _lib.load()
    ag_strategy = c.strategy_for(("ag_gemm", m, 2 * i_local, h, True), ag_strategy)
    rs_strategy = c.strategy_for(("gemm_rs", m, h, i_local), rs_strategy)
    _lib.check(lib.tessera_mlp_ex(c.session, _stream(c), x.data_ptr(), w_gate_up.data_ptr(), w_down.data_ptr(),
                                  out.data_ptr(), m, x.shape[0], h, i_local, _DTYPES[dt], ag_strategy, rs_strategy))
    return out


@mlp.register_fake
def _(x, w_gate_up, w_down, ctx, m, ag_strategy=0, rs_strategy=0):
    c = lookup(ctx)
    _check_tensors("mlp", c, False, x=x, w_gate_up=w_gate_up, w_down=w_down)
    _mlp_shapes(c, x, w_gate_up, w_down, m)
    return torch.empty_like(x)


# ---- swiglu (element-wise; no context) ---------------------------------------------------------------------------
def _swiglu_shapes(op, gu, dh=None):
    _need(gu.dim() == 2 and gu.shape[1] % 2 == 0, f"tessera::{op}: gu must be 2-D [M, 2I], got {tuple(gu.shape)}")
    _need(gu.dtype in _DTYPES, f"tessera::{op}: gu has dtype {gu.dtype}; bf16 or fp16 only", TypeError)
    if dh is not None:
        _need(tuple(dh.shape) == (gu.shape[0], gu.shape[1] // 2),
              f"tessera::{op}: dh is {tuple(dh.shape)}, expected {(gu.shape[0], gu.shape[1] // 2)}")
        _need(dh.dtype == gu.dtype and dh.device == gu.device,
              f"tessera::{op}: dh ({dh.dtype}, {dh.device}) must match gu ({gu.dtype}, {gu.device})", TypeError)


def _swiglu_kernel_takes(*ts):
    """The kernel reads 16-byte vectors: packed rows, I a multiple of 4, 16-byte aligned pointers."""
    return all(t.is_contiguous() and t.data_ptr() % 16 == 0 for t in ts) and (ts[0].shape[1] // 2) % 4 == 0


def swiglu_reference(gu):
    g, u = gu[:, 0::2].float(), gu[:, 1::2].float()
    return (torch.nn.functional.silu(g) * u).to(gu.dtype)


def swiglu_backward_reference(gu, dh):
    g, u, d = gu[:, 0::2].float(), gu[:, 1::2].float(), dh.float()
    sg = torch.sigmoid(g)
    silu = g * sg
    dgu = torch.stack((d * u * (sg * (1 + g * (1 - sg))), d * silu), dim=-1).reshape(gu.shape).to(gu.dtype)
    return dgu, (silu * u).to(gu.dtype)


@torch.library.custom_op("tessera::swiglu", mutates_args=(), device_types="cuda")
def swiglu(gu: Tensor) -> Tensor:
    _swiglu_shapes("swiglu", gu)
    if gu.numel() == 0 or not _swiglu_kernel_takes(gu):
        return swiglu_reference(gu)
    h = gu.new_empty((gu.shape[0], gu.shape[1] // 2))
    lib = _lib.load()
    _lib.check(lib.tessera_swiglu_forward(torch.cuda.current_stream(gu.device).cuda_stream, gu.data_ptr(),
                                          h.data_ptr(), gu.shape[0], gu.shape[1] // 2, _DTYPES[gu.dtype]))
    return h


@swiglu.register_fake
def _(gu):
    _swiglu_shapes("swiglu", gu)
    return gu.new_empty((gu.shape[0], gu.shape[1] // 2))


@swiglu.register_kernel("cpu")
def _(gu):
    # The same op on CPU tensors (a TP = 1 module on the CPU): the reference math.
    _swiglu_shapes("swiglu", gu)
    return swiglu_reference(gu)


@torch.library.custom_op("tessera::swiglu_backward", mutates_args=(), device_types="cuda")
def swiglu_backward(gu: Tensor, dh: Tensor) -> tuple[Tensor, Tensor]:
    _swiglu_shapes("swiglu_backward", gu, dh)
    if gu.numel() == 0 or not _swiglu_kernel_takes(gu, dh):
        return swiglu_backward_reference(gu, dh)
    dgu, h = torch.empty_like(gu), gu.new_empty((gu.shape[0], gu.shape[1] // 2))
    lib = _lib.load()
    _lib.check(lib.tessera_swiglu_backward(torch.cuda.current_stream(gu.device).cuda_stream, gu.data_ptr(),
                                           dh.data_ptr(), dgu.data_ptr(), h.data_ptr(), gu.shape[0],
                                           gu.shape[1] // 2, _DTYPES[gu.dtype]))
    return dgu, h


@swiglu_backward.register_fake
def _(gu, dh):
    _swiglu_shapes("swiglu_backward", gu, dh)
    return torch.empty_like(gu), gu.new_empty((gu.shape[0], gu.shape[1] // 2))


@swiglu_backward.register_kernel("cpu")
def _(gu, dh):
    _swiglu_shapes("swiglu_backward", gu, dh)
    return swiglu_backward_reference(gu, dh)


# ---- transpose (no context) --------------------------------------------------------------------------------------
@torch.library.custom_op("tessera::transpose", mutates_args=(), device_types="cuda")
def transpose(w: Tensor) -> Tensor:
    _need(w.dim() == 2, f"tessera::transpose: w must be 2-D, got shape {tuple(w.shape)}")
    if w.dtype not in _DTYPES or not w.is_contiguous() or w.shape[0] > 65535 * 32:
        return w.t().clone(memory_format=torch.contiguous_format)
    out = w.new_empty((w.shape[1], w.shape[0]))
    if w.numel():
        lib = _lib.load()
        _lib.check(lib.tessera_transpose(torch.cuda.current_stream(w.device).cuda_stream, w.data_ptr(),
                                         out.data_ptr(), w.shape[0], w.shape[1], _DTYPES[w.dtype]))
    return out


@transpose.register_fake
def _(w):
    _need(w.dim() == 2, f"tessera::transpose: w must be 2-D, got shape {tuple(w.shape)}")
    return w.new_empty((w.shape[1], w.shape[0]))


@transpose.register_kernel("cpu")
def _(w):
    _need(w.dim() == 2, f"tessera::transpose: w must be 2-D, got shape {tuple(w.shape)}")
    return w.t().clone(memory_format=torch.contiguous_format)


# ---- sp_attention / sp_attention_lse ---------------------------------------------------------------------------
_SP_STRATEGIES = (0, 1, 3, 5, 6, 8)  # automatic, sequential, fused_ce, ring, ulysses, two_level


def _sp_shapes(op, q, k, v, softmax_scale, strategy):
    """(batch, shard rows 2C, heads_q, heads_kv, head_dim) after the checks the library makes before a launch."""
    b, rows, hq, d = q.shape
    _need(tuple(k.shape) == tuple(v.shape), f"tessera::{op}: k is {tuple(k.shape)} but v is {tuple(v.shape)}")
    _need(k.shape[0] == b and k.shape[1] == rows,
          f"tessera::{op}: k has batch {k.shape[0]} and {k.shape[1]} rows but q has batch {b} and {rows} rows")
    _need(k.shape[3] == d, f"tessera::{op}: k has head_dim {k.shape[3]} but q has {d}")
    _need(d in (64, 128), f"tessera::{op}: head_dim = {d} (64 or 128)")
    _need(b >= 1, f"tessera::{op}: batch = {b} must be >= 1")
    _need(rows >= 2 and rows % 2 == 0,
          f"tessera::{op}: q has {rows} rows; a zig-zag shard holds two chunks of equal length (an even number >= 2)")
    hkv = k.shape[2]
    _need(hkv >= 1 and hq >= 1 and hq % hkv == 0, f"tessera::{op}: heads_q = {hq} is not a multiple of heads_kv = {hkv}")
    _need(softmax_scale >= 0 and softmax_scale == softmax_scale and softmax_scale != float("inf"),
          f"tessera::{op}: softmax_scale = {softmax_scale} (finite, >= 0; 0: 1/sqrt(head_dim))")
    _need(strategy in _SP_STRATEGIES,
          f"tessera::{op}: strategy {strategy}: automatic (0), sequential (1), fused_ce (3), ring (5), ulysses (6) or "
          "two_level (8)")
    return b, rows, hq, hkv, d


def _sp_run(op, q, k, v, ctx_handle, causal, softmax_scale, strategy, want_lse):
    c = lookup(ctx_handle)
    dt = _check_tensors(op, c, True, ndim=4, q=q, k=k, v=v)
    b, rows, hq, hkv, d = _sp_shapes(op, q, k, v, softmax_scale, strategy)
    _check_aligned(op, q=q, k=k, v=v)
    o = torch.empty_like(q)
    lse = torch.empty((b, hq, rows), dtype=torch.float32, device=q.device) if want_lse else None
    lib = _lib.load()
    _lib.check(lib.tessera_sp_attention_ex(c.session, _stream(c), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                           o.data_ptr(), lse.data_ptr() if want_lse else None, b, rows * c.world, hq,
                                           hkv, d, _DTYPES[dt], 1 if causal else 0, softmax_scale, strategy))
    return o, lse


def _sp_fake(op, q, k, v, ctx, softmax_scale, strategy):
    _check_tensors(op, lookup(ctx), False, ndim=4, q=q, k=k, v=v)
    return _sp_shapes(op, q, k, v, softmax_scale, strategy)


@torch.library.custom_op("tessera::sp_attention", mutates_args=(), device_types="cuda")
def sp_attention(q: Tensor, k: Tensor, v: Tensor, ctx: int, causal: bool = True, softmax_scale: float = 0.0,
                 strategy: int = 0) -> Tensor:
    return _sp_run("sp_attention", q, k, v, ctx, causal, softmax_scale, strategy, False)[0]


@sp_attention.register_fake
def _(q, k, v, ctx, causal=True, softmax_scale=0.0, strategy=0):
    _sp_fake("sp_attention", q, k, v, ctx, softmax_scale, strategy)
    return torch.empty_like(q)


@torch.library.custom_op("tessera::sp_attention_lse", mutates_args=(), device_types="cuda")
def sp_attention_lse(q: Tensor, k: Tensor, v: Tensor, ctx: int, causal: bool = True, softmax_scale: float = 0.0,
                     strategy: int = 0) -> tuple[Tensor, Tensor]:
    return _sp_run("sp_attention_lse", q, k, v, ctx, causal, softmax_scale, strategy, True)


@sp_attention_lse.register_fake
def _(q, k, v, ctx, causal=True, softmax_scale=0.0, strategy=0):
    b, rows, hq, _, _ = _sp_fake("sp_attention_lse", q, k, v, ctx, softmax_scale, strategy)
    return torch.empty_like(q), q.new_empty((b, hq, rows), dtype=torch.float32)


# ---- Mixture-of-Experts layers: moe_tp / moe_ep, and the router moe_topk -------------------------------------------
_MOE_STRATEGIES = (0, 1, 7)  # automatic, sequential, pipelined
_MOE_MAX_EXPERTS, _MOE_MAX_TOPK = 1024, 16  # kernels::moe::kMaxExperts, kMaxTopK
_ROUTER_DTYPES = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}


def _moe_shapes(op, c, device_check, x, expert_ids, weights, w_gate_up, w_down, strategy, experts_per_weight):
    """(tokens_local, hidden, inter, experts, topk) after the checks the library makes before a launch.
    experts = experts_per_weight · w_gate_up.shape[0] (1 for moe_tp, whose ranks hold every expert; the world for
    moe_ep, whose rank holds its E / world)."""
    _check_tensors(op, c, device_check, x=x)
    dt = _check_tensors(op, c, device_check, ndim=3, w_gate_up=w_gate_up, w_down=w_down)
    _need(x.dtype == torch.bfloat16, f"tessera::{op}: x has dtype {x.dtype}; the MoE layers take bf16 only", TypeError)
    _need(dt == x.dtype, f"tessera::{op}: w_gate_up has dtype {dt} but x has {x.dtype}", TypeError)
    t, h = x.shape
    for name, r, want in (("expert_ids", expert_ids, torch.int32), ("weights", weights, torch.float32)):
        _need(r.dim() == 2, f"tessera::{op}: {name} must be 2-D [tokens_local, topk], got shape {tuple(r.shape)}")
        _need(r.dtype == want, f"tessera::{op}: {name} has dtype {r.dtype}; it must be {want}", TypeError)
        _need(r.is_contiguous(), f"tessera::{op}: {name} must be contiguous (row-major), got strides {r.stride()}")
        if device_check:
            _need(r.device == c.device,
                  f"tessera::{op}: {name} is on {r.device}, but the context's device is {c.device}")
        _need(r.shape[0] == t, f"tessera::{op}: {name} has {r.shape[0]} rows but x has {t} tokens")
    k = expert_ids.shape[1]
    _need(tuple(weights.shape) == tuple(expert_ids.shape),
          f"tessera::{op}: weights is {tuple(weights.shape)} but expert_ids is {tuple(expert_ids.shape)}")
    e_local, i = w_down.shape[0], w_down.shape[2]
    inter = "inter_local" if op == "moe_tp" else "inter"
    _need(tuple(w_down.shape) == (e_local, h, i),
          f"tessera::{op}: w_down is {tuple(w_down.shape)}, expected (experts, hidden = {h}, {inter})")
    _need(tuple(w_gate_up.shape) == (e_local, 2 * i, h),
          f"tessera::{op}: w_gate_up is {tuple(w_gate_up.shape)}, expected {(e_local, 2 * i, h)} "
          f"(experts, 2·{inter}, hidden) to match w_down {tuple(w_down.shape)}")
    _need(h >= 8 and h % 8 == 0, f"tessera::{op}: hidden = {h} must be a positive multiple of 8")
    _need(i >= 8 and i % 8 == 0, f"tessera::{op}: {inter} = {i} must be a positive multiple of 8")
    e = e_local * experts_per_weight
    _need(1 <= e <= _MOE_MAX_EXPERTS, f"tessera::{op}: experts = {e} out of range [1, {_MOE_MAX_EXPERTS}]")
    _need(1 <= k <= min(_MOE_MAX_TOPK, e),
          f"tessera::{op}: topk = {k} (expert_ids' columns) out of range [1, min({_MOE_MAX_TOPK}, experts = {e})]")
    _need(strategy in _MOE_STRATEGIES,
          f"tessera::{op}: strategy {strategy}: automatic (0), sequential (1) or pipelined (7)")
    return t, h, i, e, k


def _moe_pointers(op, x, expert_ids, weights, w_gate_up, w_down, out):
    """Device pointers for the library: 16-byte aligned matrices; an empty token shard (tokens_local = 0, which a
    rank may have and must still join the collective with) passes a scratch buffer the layer never reads."""
    _check_aligned(op, x=x, w_gate_up=w_gate_up, w_down=w_down)
    ts = (x, expert_ids, weights, out)
    if x.shape[0] == 0:
        scratch = torch.empty(16, dtype=torch.float32, device=x.device)
        return (scratch.data_ptr(),) * 4 + (scratch,)
    return tuple(t.data_ptr() for t in ts) + (None,)


@torch.library.custom_op("tessera::moe_tp", mutates_args=(), device_types="cuda")
def moe_tp(x: Tensor, expert_ids: Tensor, weights: Tensor, w_gate_up: Tensor, w_down: Tensor, ctx: int,
           strategy: int = 0) -> Tensor:
    c = lookup(ctx)
    t, h, i, e, k = _moe_shapes("moe_tp", c, True, x, expert_ids, weights, w_gate_up, w_down, strategy, 1)
    out = torch.empty_like(x)
    px, pids, pw, pout, _keep = _moe_pointers("moe_tp", x, expert_ids, weights, w_gate_up, w_down, out)
    lib = _lib.load()
    _lib.check(lib.tessera_moe_tp_ex(c.session, _stream(c), px, pids, pw, w_gate_up.data_ptr(), w_down.data_ptr(),
                                     pout, t, h, i, e, k, _DTYPES[x.dtype], strategy))
    return out


@moe_tp.register_fake
def _(x, expert_ids, weights, w_gate_up, w_down, ctx, strategy=0):
    _moe_shapes("moe_tp", lookup(ctx), False, x, expert_ids, weights, w_gate_up, w_down, strategy, 1)
    return torch.empty_like(x)


def _check_capacity(op, capacity):
    _need(isinstance(capacity, int) and 0 <= capacity < 2 ** 31,
          f"tessera::{op}: capacity = {capacity!r} (rows per destination rank, >= 0; 0: tokens_local · topk)")


@torch.library.custom_op("tessera::moe_ep", mutates_args=(), device_types="cuda")
def moe_ep(x: Tensor, expert_ids: Tensor, weights: Tensor, w_gate_up: Tensor, w_down: Tensor, ctx: int,
           capacity: int = 0, strategy: int = 0) -> Tensor:
    c = lookup(ctx)
    t, h, i, e, k = _moe_shapes("moe_ep", c, True, x, expert_ids, weights, w_gate_up, w_down, strategy, c.world)
    _check_capacity("moe_ep", capacity)
    out = torch.empty_like(x)
    px, pids, pw, pout, _keep = _moe_pointers("moe_ep", x, expert_ids, weights, w_gate_up, w_down, out)
    lib = _lib.load()
    _lib.check(lib.tessera_moe_ep_ex(c.session, _stream(c), px, pids, pw, w_gate_up.data_ptr(), w_down.data_ptr(),
                                     pout, t, h, i, e, k, capacity, _DTYPES[x.dtype], strategy))
    return out


@moe_ep.register_fake
def _(x, expert_ids, weights, w_gate_up, w_down, ctx, capacity=0, strategy=0):
    c = lookup(ctx)
    _moe_shapes("moe_ep", c, False, x, expert_ids, weights, w_gate_up, w_down, strategy, c.world)
    _check_capacity("moe_ep", capacity)
    return torch.empty_like(x)


def _topk_shapes(logits, k):
    _need(logits.dim() == 2, f"tessera::moe_topk: logits must be 2-D [tokens, experts], got {tuple(logits.shape)}")
    _need(logits.dtype in _ROUTER_DTYPES, f"tessera::moe_topk: logits has dtype {logits.dtype}; float32, bf16 or fp16",
          TypeError)
    _need(logits.is_contiguous(), f"tessera::moe_topk: logits must be contiguous (row-major), got strides "
                                  f"{logits.stride()}")
    e = logits.shape[1]
    _need(1 <= e <= _MOE_MAX_EXPERTS, f"tessera::moe_topk: experts = {e} (logits' columns) out of range "
                                      f"[1, {_MOE_MAX_EXPERTS}]")
    _need(1 <= k <= min(_MOE_MAX_TOPK, e), f"tessera::moe_topk: k = {k} out of range [1, min({_MOE_MAX_TOPK}, "
                                           f"experts = {e})]")
    return logits.shape[0], e


def moe_topk_reference(logits, k, renormalize=True):
    """The router in float32 (softmax, the k largest, ties to the lower expert id; renormalized to sum 1)."""
    p = torch.softmax(logits.float(), dim=-1)
    w, ids = torch.topk(p, k, dim=-1, sorted=True)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    return ids.to(torch.int32), w


@torch.library.custom_op("tessera::moe_topk", mutates_args=(), device_types="cuda")
def moe_topk(logits: Tensor, k: int, renormalize: bool = True) -> tuple[Tensor, Tensor]:
    t, e = _topk_shapes(logits, k)
    ids = torch.empty((t, k), dtype=torch.int32, device=logits.device)
    w = torch.empty((t, k), dtype=torch.float32, device=logits.device)
    if t:
        lib = _lib.load()
        _lib.check(lib.tessera_moe_topk_gating(torch.cuda.current_stream(logits.device).cuda_stream,
                                               logits.data_ptr(), ids.data_ptr(), w.data_ptr(), t, e, k, 0,
                                               _ROUTER_DTYPES[logits.dtype], 1 if renormalize else 0))
    return ids, w


@moe_topk.register_fake
def _(logits, k, renormalize=True):
    t, _ = _topk_shapes(logits, k)
    return logits.new_empty((t, k), dtype=torch.int32), logits.new_empty((t, k), dtype=torch.float32)
