"""PyTorch front end: tessera.torch.Context over a torch.distributed group, the tessera:: custom ops, and the
tensor-parallel autograd modules.

    import torch.distributed as dist, tessera.torch as tt
    tp = dist.new_group([0, 1])
    with tt.Context(group=tp) as ctx:
        fc1 = tt.ColumnParallelLinear(4096, 14336, ctx, bias=False)
        fc2 = tt.RowParallelLinear(14336, 4096, ctx, bias=False)
        y = fc2(torch.nn.functional.gelu(fc1(x_shard)))       # x_shard: [tokens / R, 4096], bf16, this GPU
        o = tt.sp_attention(q_s, k_s, v_s, ctx)                # zig-zag sequence shards [B, S/R, H, D]
        moe = tt.TensorParallelMoE(4096, 14336, 8, 2, ctx)      # forward only: y = moe(x_shard) under no_grad
"""
from ._context import STRATEGIES, Context, shard_rows, strategy_code, tuning_shapes  # noqa: F401
from . import _ops  # noqa: F401  (registers torch.ops.tessera.*)
from .modules import ColumnParallelLinear, RowParallelLinear, TensorParallelMLP, fuse_gate_up  # noqa: F401
from .layers import TensorParallelDecoderLayer  # noqa: F401
from .attention import resolve_sp_attention, sp_attention, zigzag_shard, zigzag_unshard  # noqa: F401
from .moe import TensorParallelMoE, fuse_gate_up_experts, moe_topk  # noqa: F401
from .._lib import TesseraError  # noqa: F401

__all__ = ["Context", "ColumnParallelLinear", "RowParallelLinear", "TensorParallelMLP", "TensorParallelDecoderLayer",
           "fuse_gate_up", "sp_attention", "resolve_sp_attention", "zigzag_shard", "zigzag_unshard",
           "shard_rows", "tuning_shapes", "STRATEGIES", "TesseraError", "TensorParallelMoE", "fuse_gate_up_experts",
           "moe_topk"]
