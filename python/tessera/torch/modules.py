"""Tensor-parallel layers with sequence parallelism, built on the tessera:: custom ops.

Activations between layers are sequence-sharded: rank r holds rows [r·ceil(M/R), ...) of the M tokens.

  ColumnParallelLinear  y[M, N/R]   = AG(x[M/R, K]) · W_rᵀ (+ b_r)          backward: dX = RS(dY · W_r), dW = dYᵀ · AG(x)
  RowParallelLinear     y[M/R, N]   = RS(x[M, K/R] · W_rᵀ) (+ b)            backward: dX = AG(dY) · W_r, dW = AG(dY)ᵀ · x
  TensorParallelMLP     y[M/R, H]   = RS(SiLU(AG(x)·W_gᵀ) ⊙ (AG(x)·W_uᵀ) · W_dᵀ)

The gathered activations needed by the weight gradients come out of the forward/backward AG+GEMM itself
(ag_gemm_gathered), not from a separate all-gather. Gradients that a replicated parameter would need summed
over the group (RowParallelLinear's bias) are computed from the gathered dY, so they are already the full
sum, identical on every rank: do not all-reduce them again over the TP group.
The backward's dX GEMMs take the weight itself as B [K, N] (the ops' b_kn), so no transposed copy is made.

main_grad (Megatron's gradient-accumulation fusion): with accumulate_into_main_grad=True and a `main_grad`
tensor on the weight, the weight gradient is added into weight.main_grad in backward; the autograd gradient
is then None, or a dummy empty tensor when the weight carries `grad_added_to_main_grad` (which is set True),
as Megatron's LinearWithGradAccumulationAndAsyncCommunication does.
"""
import math

import torch
from torch import nn

from . import _ops  # noqa: F401  (registers torch.ops.tessera.*)
from ._context import shard_rows, strategy_code


def _divide(n, world, what):
    if n % world:
        raise ValueError(f"{what} = {n} is not divisible by the group's world size {world}")
    return n // world


def _weight_grad(weight, dw, accumulate):
    if accumulate and hasattr(weight, "main_grad"):
        weight.main_grad.add_(dw.to(weight.main_grad.dtype))
        if hasattr(weight, "grad_added_to_main_grad"):
            weight.grad_added_to_main_grad = True
            return torch.empty_like(weight)  # dummy, like Megatron's; the real gradient is in main_grad
        return None
    return dw


def _total_rows(x, ctx, m):
    return x.shape[0] * ctx.world if m is None else m


class _ColumnParallelFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, handle, m, fwd_strategy, bwd_strategy, accumulate):
        y, xg = torch.ops.tessera.ag_gemm_gathered(x, weight, handle, m, False, fwd_strategy)
        if bias is not None:
            y = y + bias
        ctx.save_for_backward(xg, weight)
        ctx.handle, ctx.bwd_strategy, ctx.accumulate, ctx.has_bias = handle, bwd_strategy, accumulate, bias is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        xg, weight = ctx.saved_tensors
        dy = dy.contiguous()
        dx = None
        if ctx.needs_input_grad[0]:
            dx = torch.ops.tessera.gemm_rs(dy, weight, ctx.handle, ctx.bwd_strategy, True)  # dy · W, W as [K, N]
        dw = _weight_grad(weight, dy.t().mm(xg), ctx.accumulate) if ctx.needs_input_grad[1] else None
        db = dy.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db, None, None, None, None, None


class _RowParallelFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, handle, fwd_strategy, bwd_strategy, accumulate):
        y = torch.ops.tessera.gemm_rs(x, weight, handle, fwd_strategy)
        if bias is not None:
            y = y + bias
        ctx.save_for_backward(x, weight)
        ctx.handle, ctx.bwd_strategy, ctx.accumulate, ctx.has_bias = handle, bwd_strategy, accumulate, bias is not None
        ctx.m = x.shape[0]
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dy = dy.contiguous()
        dx, dyg = torch.ops.tessera.ag_gemm_gathered(dy, weight, ctx.handle, ctx.m, False, ctx.bwd_strategy, True)
        dw = _weight_grad(weight, dyg.t().mm(x), ctx.accumulate) if ctx.needs_input_grad[1] else None
        db = dyg.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return (dx if ctx.needs_input_grad[0] else None), dw, db, None, None, None, None


class _MlpFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w_gate_up, w_down, handle, m, ag_strategy, rs_strategy, accumulate):
        gu, xg = torch.ops.tessera.ag_gemm_gathered(x, w_gate_up, handle, m, False, ag_strategy)
        h = torch.ops.tessera.swiglu(gu)  # SiLU(gate) * up, gate/up interleaved by columns
        y = torch.ops.tessera.gemm_rs(h, w_down, handle, rs_strategy)
        ctx.save_for_backward(xg, gu, w_gate_up, w_down)
        ctx.handle, ctx.m, ctx.accumulate = handle, m, accumulate
        ctx.ag_strategy, ctx.rs_strategy = ag_strategy, rs_strategy
        return y

    @staticmethod
    def backward(ctx, dy):
        xg, gu, w_gate_up, w_down = ctx.saved_tensors
        dy = dy.contiguous()
        # Down projection (row parallel): dh = AG(dy) · W_d, dW_d = AG(dy)ᵀ · h.
        dh, dyg = torch.ops.tessera.ag_gemm_gathered(dy, w_down, ctx.handle, ctx.m, False, ctx.rs_strategy, True)
        dgu, h = torch.ops.tessera.swiglu_backward(gu, dh)  # one pass; h recomputed rather than kept
        dwd = _weight_grad(w_down, dyg.t().mm(h), ctx.accumulate) if ctx.needs_input_grad[2] else None
        # Gate/up projection (column parallel): dx = RS(dgu · W_gu), dW_gu = dguᵀ · AG(x).
        dx = None
        if ctx.needs_input_grad[0]:
            dx = torch.ops.tessera.gemm_rs(dgu, w_gate_up, ctx.handle, ctx.ag_strategy, True)
        dwgu = _weight_grad(w_gate_up, dgu.t().mm(xg), ctx.accumulate) if ctx.needs_input_grad[1] else None
        return dx, dwgu, dwd, None, None, None, None, None


def _check_input(module, x):
    ctx = module.context
    if ctx.closed:
        raise RuntimeError(f"{type(module).__name__}: its tessera context was closed")
    if x.dim() != 2:
        raise ValueError(f"{type(module).__name__}: input must be 2-D [tokens, features], got {tuple(x.shape)} "
                         "(flatten batch and sequence first)")
    if not x.is_contiguous():
        x = x.contiguous()
    return x


class _TpModule(nn.Module):
    def __init__(self, context, strategy, backward_strategy, accumulate_into_main_grad):
        super().__init__()
        self.context = context
        self.handle = context.handle
        self.strategy = strategy_code(strategy)
        self.backward_strategy = strategy_code(backward_strategy if backward_strategy is not None else strategy)
        self.accumulate_into_main_grad = accumulate_into_main_grad


class ColumnParallelLinear(_TpModule):
    """y = AG(x) · Wᵀ + b over the context's group, output features split: weight [out_features / R, in_features].

    Input x [M/R, in_features] (this rank's sequence shard), output [M, out_features / R].
    forward(x, m=None): m is the total token count (default: x's rows × R; pass it for ragged shards).
    """

    def __init__(self, in_features, out_features, context, bias=True, dtype=torch.bfloat16, device=None,
                 strategy="automatic", backward_strategy=None, accumulate_into_main_grad=False):
        super().__init__(context, strategy, backward_strategy, accumulate_into_main_grad)
        self.in_features, self.out_features = in_features, out_features
        self.out_per_rank = _divide(out_features, context.world, "out_features")
        device = context.device if device is None else device
        self.weight = nn.Parameter(torch.empty(self.out_per_rank, in_features, dtype=dtype, device=device))
        self.bias = nn.Parameter(torch.empty(self.out_per_rank, dtype=dtype, device=device)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features)
            nn.init.uniform_(self.bias, -bound, bound)

    @torch.no_grad()
    def load_full(self, weight, bias=None):
        """Copies this rank's rows of a full [out_features, in_features] weight (and bias)."""
        r, n = self.context.rank, self.out_per_rank
        self.weight.copy_(weight[r * n:(r + 1) * n])
        if self.bias is not None and bias is not None:
            self.bias.copy_(bias[r * n:(r + 1) * n])
        return self

    def forward(self, x, m=None):
        x = _check_input(self, x)
        return _ColumnParallelFn.apply(x, self.weight, self.bias, self.handle, _total_rows(x, self.context, m),
                                       self.strategy, self.backward_strategy, self.accumulate_into_main_grad)

    def extra_repr(self):
        return f"in={self.in_features}, out={self.out_features} ({self.out_per_rank} per rank), bias={self.bias is not None}"


class RowParallelLinear(_TpModule):
    """y = RS(x · Wᵀ) + b over the context's group, input features split: weight [out_features, in_features / R].

    Input x [M, in_features / R], output [M/R, out_features] (this rank's sequence shard). The bias is replicated;
    its gradient is the whole sequence's (see the module docstring).
    """

    def __init__(self, in_features, out_features, context, bias=True, dtype=torch.bfloat16, device=None,
                 strategy="automatic", backward_strategy=None, accumulate_into_main_grad=False):
        super().__init__(context, strategy, backward_strategy, accumulate_into_main_grad)
        self.in_features, self.out_features = in_features, out_features
        self.in_per_rank = _divide(in_features, context.world, "in_features")
        device = context.device if device is None else device
        self.weight = nn.Parameter(torch.empty(out_features, self.in_per_rank, dtype=dtype, device=device))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype, device=device)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features)
            nn.init.uniform_(self.bias, -bound, bound)

    @torch.no_grad()
    def load_full(self, weight, bias=None):
        """Copies this rank's columns of a full [out_features, in_features] weight (and the bias)."""
        r, k = self.context.rank, self.in_per_rank
        self.weight.copy_(weight[:, r * k:(r + 1) * k])
        if self.bias is not None and bias is not None:
            self.bias.copy_(bias)
        return self

    def forward(self, x):
        x = _check_input(self, x)
        return _RowParallelFn.apply(x, self.weight, self.bias, self.handle, self.strategy, self.backward_strategy,
                                    self.accumulate_into_main_grad)

    def extra_repr(self):
        return f"in={self.in_features} ({self.in_per_rank} per rank), out={self.out_features}, bias={self.bias is not None}"


def fuse_gate_up(w_gate, w_up):
    """The fused gate/up weight [2·I, H] with gate and up rows interleaved (row 2j gate_j, 2j+1 up_j)."""
    if w_gate.shape != w_up.shape:
        raise ValueError(f"fuse_gate_up: w_gate {tuple(w_gate.shape)} and w_up {tuple(w_up.shape)} differ")
    return torch.stack((w_gate, w_up), dim=1).reshape(2 * w_gate.shape[0], w_gate.shape[1])


class TensorParallelMLP(_TpModule):
    """Gated MLP (Llama): y = W_d(SiLU(W_g x) ⊙ W_u x), sequence parallel, no bias.

    x [M/R, hidden] -> y [M/R, hidden]. Parameters: w_gate_up [2·intermediate/R, hidden] (gate/up interleaved by
    rows, see fuse_gate_up) and w_down [hidden, intermediate/R]. Without autograd (inference, torch.no_grad) the
    whole layer is the fused tessera::mlp (SiLU·up in the AG+GEMM epilogue). With autograd the forward keeps the
    gate/up pre-activations for backward: AG+GEMM, SiLU·up, GEMM+RS.
    """

    def __init__(self, hidden, intermediate, context, dtype=torch.bfloat16, device=None, strategy="automatic",
                 rs_strategy=None, accumulate_into_main_grad=False):
        super().__init__(context, strategy, None, accumulate_into_main_grad)
        self.hidden, self.intermediate = hidden, intermediate
        self.i_per_rank = _divide(intermediate, context.world, "intermediate")
        self.rs_strategy = strategy_code(rs_strategy if rs_strategy is not None else strategy)
        device = context.device if device is None else device
        self.w_gate_up = nn.Parameter(torch.empty(2 * self.i_per_rank, hidden, dtype=dtype, device=device))
        self.w_down = nn.Parameter(torch.empty(hidden, self.i_per_rank, dtype=dtype, device=device))
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.kaiming_uniform_(self.w_gate_up, a=math.sqrt(5))
        nn.init.kaiming_uniform_(self.w_down, a=math.sqrt(5))

    @torch.no_grad()
    def load_full(self, w_gate, w_up, w_down):
        """Copies this rank's part of full gate/up [intermediate, hidden] and down [hidden, intermediate] weights."""
        r, i = self.context.rank, self.i_per_rank
        self.w_gate_up.copy_(fuse_gate_up(w_gate[r * i:(r + 1) * i], w_up[r * i:(r + 1) * i]))
        self.w_down.copy_(w_down[:, r * i:(r + 1) * i])
        return self

    def forward(self, x, m=None):
        x = _check_input(self, x)
        m = _total_rows(x, self.context, m)
        if torch.is_grad_enabled() and (x.requires_grad or self.w_gate_up.requires_grad or self.w_down.requires_grad):
            return _MlpFn.apply(x, self.w_gate_up, self.w_down, self.handle, m, self.strategy, self.rs_strategy,
                                self.accumulate_into_main_grad)
        return torch.ops.tessera.mlp(x, self.w_gate_up, self.w_down, self.handle, m, self.strategy, self.rs_strategy)

    def extra_repr(self):
        return f"hidden={self.hidden}, intermediate={self.intermediate} ({self.i_per_rank} per rank)"


__all__ = ["ColumnParallelLinear", "RowParallelLinear", "TensorParallelMLP", "fuse_gate_up", "shard_rows"]
