# The README's Python example: pip install . ; torchrun --nproc-per-node <GPUs> python/examples/tp_mlp.py
import torch
import torch.distributed as dist

import tessera.torch as tt

dist.init_process_group("nccl")
torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
with tt.Context(group=dist.group.WORLD) as ctx:  # any group of GPUs on this node (your TP group); no port of its own
    mlp = tt.TensorParallelMLP(4096, 14336, ctx)  # gated MLP, sequence parallel, bf16, weights split over the group
    x = torch.randn(8192 // ctx.world, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = mlp(x)                                    # [8192 / R, 4096]: AG+GEMM, SiLU·up, GEMM+RS
    y.float().square().mean().backward()          # backward: AG+GEMM and GEMM+RS again
    z = ctx.gemm_ar(y.detach(), torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16))  # torch.ops.tessera.*
    torch.cuda.synchronize()
    print(f"rank {ctx.rank}/{ctx.world}: y {tuple(y.shape)}, dx {tuple(x.grad.shape)}, z {tuple(z.shape)}")
dist.destroy_process_group()
