"""Mixture-of-Experts: the tensor-parallel layer tessera.torch.TensorParallelMoE (forward only) and the router
tessera.torch.moe_topk.

    moe = tt.TensorParallelMoE(hidden=4096, intermediate=14336, experts=8, topk=2, context=ctx)
    moe.load_full(w_gate, w_up, w_down, router)     # full [E, I, H], [E, I, H], [E, H, I] and [E, H] weights
    with torch.no_grad():
        y = moe(x_shard)                             # x_shard: this rank's [T / R, H] tokens, bf16 -> [T / R, H]
    ctx.moe_tp_check_status()                        # optional: waits, raises on invalid expert ids

Forward only: the layer (torch.ops.tessera.moe_tp and moe_topk) has no autograd formula, so a backward through it
raises a RuntimeError instead of returning gradients; use it for inference, under torch.no_grad().

The expert-parallel layer is the op torch.ops.tessera.moe_ep (Context.moe_ep): each rank passes the weights of
its E / world experts and a routing of its own tokens.
"""
import math

import torch
from torch import nn

from . import _ops  # noqa: F401  (registers torch.ops.tessera.*)
from ._context import strategy_code
from ._ops import _MOE_MAX_EXPERTS, _MOE_MAX_TOPK, _MOE_STRATEGIES
from .modules import _divide


def moe_topk(logits, k, renormalize=True):
    """The router: softmax over the experts of logits [T, E] (float32, bf16 or fp16) in float32, then the k largest
    (ties to the lower expert id), slots in descending weight. Returns (expert_ids [T, k] int32, weights [T, k]
    float32); renormalize divides a token's k weights by their sum (Mixtral), else they are the probabilities."""
    return torch.ops.tessera.moe_topk(logits, k, renormalize)


def fuse_gate_up_experts(w_gate, w_up):
    """Per expert, the fused gate/up weight: [E, 2·I, H] with gate and up rows interleaved (row 2j gate_j, 2j+1
    up_j) from w_gate and w_up [E, I, H] (fuse_gate_up for each expert)."""
    if w_gate.shape != w_up.shape or w_gate.dim() != 3:
        raise ValueError(f"fuse_gate_up_experts: w_gate {tuple(w_gate.shape)} and w_up {tuple(w_up.shape)} must be "
                         "equal 3-D [experts, intermediate, hidden]")
    e, i, h = w_gate.shape
    return torch.stack((w_gate, w_up), dim=2).reshape(e, 2 * i, h)


class TensorParallelMoE(nn.Module):
    """Mixture-of-Experts layer (SwiGLU experts), tensor parallel over the context's group, sequence-sharded
    activations: x [T/R, hidden] -> [T/R, hidden] (torch.ops.tessera.moe_tp). Forward only (see the module
    docstring).

    Parameters: w_gate_up [experts, 2·intermediate/R, hidden] (each expert's gate/up rows interleaved, see
    fuse_gate_up_experts), w_down [experts, hidden, intermediate/R] — this rank's intermediate shard of every
    expert — and, with router=True, router [experts, hidden] (replicated: every rank routes its own tokens).
    forward(x, expert_ids=None, weights=None): the routing is the router's top-k (moe_topk) unless given
    (expert_ids [T/R, topk] int32, weights [T/R, topk] float32).
    """

    def __init__(self, hidden, intermediate, experts, topk, context, router=True, renormalize=True,
                 dtype=torch.bfloat16, device=None, strategy="automatic"):
        super().__init__()
        if not 1 <= experts <= _MOE_MAX_EXPERTS:
            raise ValueError(f"experts = {experts} out of range [1, {_MOE_MAX_EXPERTS}]")
        if not 1 <= topk <= min(_MOE_MAX_TOPK, experts):
            raise ValueError(f"topk = {topk} out of range [1, min({_MOE_MAX_TOPK}, experts = {experts})]")
        self.strategy = strategy_code(strategy)
        if self.strategy not in _MOE_STRATEGIES:
            raise ValueError(f"strategy {strategy!r}: automatic, sequential or pipelined")
        self.context, self.handle = context, context.handle
        self.hidden, self.intermediate, self.experts, self.topk = hidden, intermediate, experts, topk
        self.renormalize = renormalize
        self.i_per_rank = _divide(intermediate, context.world, "intermediate")
        device = context.device if device is None else device
        kw = dict(dtype=dtype, device=device)
        self.w_gate_up = nn.Parameter(torch.empty(experts, 2 * self.i_per_rank, hidden, **kw))
        self.w_down = nn.Parameter(torch.empty(experts, hidden, self.i_per_rank, **kw))
        self.router = nn.Parameter(torch.empty(experts, hidden, **kw)) if router else None
        self.reset_parameters()

    def reset_parameters(self):
        with torch.no_grad():
            for w, fan_in in ((self.w_gate_up, self.hidden), (self.w_down, self.intermediate),
                              (self.router, self.hidden)):
                if w is not None:
                    w.uniform_(-1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in))

    @torch.no_grad()
    def load_full(self, w_gate, w_up, w_down, router=None):
        """Copies this rank's shard of full weights: gate and up [experts, intermediate, hidden], down [experts,
        hidden, intermediate] (and the router [experts, hidden])."""
        r, i = self.context.rank, self.i_per_rank
        self.w_gate_up.copy_(fuse_gate_up_experts(w_gate[:, r * i:(r + 1) * i], w_up[:, r * i:(r + 1) * i]))
        self.w_down.copy_(w_down[:, :, r * i:(r + 1) * i])
        if router is not None:
            if self.router is None:
                raise ValueError("load_full: router given, but the layer was built with router=False")
            self.router.copy_(router)
        return self

    def route(self, x):
        """(expert_ids, weights) of the router's top-k for tokens x."""
        if self.router is None:
            raise ValueError("TensorParallelMoE: built with router=False, so forward needs expert_ids and weights")
        return moe_topk(torch.nn.functional.linear(x, self.router), self.topk, self.renormalize)

    def forward(self, x, expert_ids=None, weights=None):
        if self.context.closed:
            raise RuntimeError("TensorParallelMoE: its tessera context was closed")
        if x.dim() != 2:
            raise ValueError(f"TensorParallelMoE: input must be 2-D [tokens, hidden], got {tuple(x.shape)} "
                             "(flatten batch and sequence first)")
        x = x.contiguous()
        if (expert_ids is None) != (weights is None):
            raise ValueError("TensorParallelMoE: pass both expert_ids and weights, or neither (the router's)")
        if expert_ids is None:
            expert_ids, weights = self.route(x)
        return torch.ops.tessera.moe_tp(x, expert_ids, weights, self.w_gate_up, self.w_down, self.handle,
                                        self.strategy)

    def extra_repr(self):
        return (f"hidden={self.hidden}, intermediate={self.intermediate} ({self.i_per_rank} per rank), "
                f"experts={self.experts}, topk={self.topk}, router={self.router is not None}")


__all__ = ["TensorParallelMoE", "moe_topk", "fuse_gate_up_experts"]
