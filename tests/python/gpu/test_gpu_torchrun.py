"""GPU tests of tessera.torch under torchrun, one process per GPU (scripts/device-check.sh step `python`):

    torchrun --nproc-per-node <gpus> -m pytest tests/python/gpu -q -rs

They run at any world size W. At W = 1 the contexts are one-rank groups: the operators, the modules' autograd
wiring and the stream ordering are still checked against PyTorch; test_tp2_* skip visibly until 2 GPUs are lent.
References: nn.Linear on the whole, unsharded layer (same seed on every rank) and torch.distributed
collectives + matmul for the operators.
"""
import os

import pytest

torch = pytest.importorskip("torch")
if "LOCAL_RANK" not in os.environ:
    pytest.skip("run under torchrun (scripts/device-check.sh step python)", allow_module_level=True)
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tessera.torch as tt  # noqa: E402

TOL = 2e-2  # relative Frobenius error, bf16


def rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


@pytest.fixture(scope="module")
def world():
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    yield dist.get_rank(), dist.get_world_size(), dev
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ctx(world):
    c = tt.Context()  # the default (world) group
    yield c
    c.close()


def randn(*shape, seed, dev, scale=1.0):
    g = torch.Generator(device=dev).manual_seed(seed)
    return (torch.randn(*shape, generator=g, device=dev) * scale).bfloat16()


# ---- swiglu ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rows,inter,dtype", [(1000, 1024, torch.bfloat16), (37, 8, torch.float16),
                                              (5, 6, torch.bfloat16), (0, 16, torch.bfloat16)])
def test_swiglu_ops_match_float32(world, rows, inter, dtype):
    """The fused kernel (inter % 4 == 0) and the fallback (inter = 6) against float64."""
    _, _, dev = world
    gu = (randn(rows, 2 * inter, seed=11, dev=dev) * 3).to(dtype)
    dh = randn(rows, inter, seed=12, dev=dev).to(dtype)
    g, u, d = gu[:, 0::2].double(), gu[:, 1::2].double(), dh.double()
    sg = torch.sigmoid(g)
    h_ref = g * sg * u
    dgu_ref = torch.stack((d * u * sg * (1 + g * (1 - sg)), d * g * sg), -1).reshape(rows, 2 * inter)
    h = torch.ops.tessera.swiglu(gu)
    dgu, h2 = torch.ops.tessera.swiglu_backward(gu, dh)
    torch.cuda.synchronize()
    for got, ref in ((h, h_ref), (h2, h_ref), (dgu, dgu_ref)):
        assert got.dtype == dtype and got.shape == ref.shape
        assert not got.isnan().any()
        if rows:
            assert rel_err(got, ref) < 1e-2
    with pytest.raises(ValueError, match="dh is"):
        torch.ops.tessera.swiglu_backward(gu, dh[:, :-1] if inter > 1 else dh[:0])


# Even shapes on 4-byte-aligned storage take the 32-bit-pair kernel (whole and partial 64x64 tiles); odd shapes
# and storage offset by one element take the 16-bit kernel.
@pytest.mark.parametrize("rows,cols,dtype,offset", [(3072, 4096, torch.bfloat16, 0), (130, 4098, torch.bfloat16, 0),
                                                    (66, 70, torch.float16, 0), (64, 71, torch.bfloat16, 0),
                                                    (66, 70, torch.bfloat16, 1), (37, 1001, torch.float16, 0),
                                                    (0, 8, torch.bfloat16, 0)])
def test_transpose_op_is_exact(world, rows, cols, dtype, offset):
    _, _, dev = world
    flat = randn(rows * cols + offset, 1, seed=3, dev=dev).to(dtype).reshape(-1)
    w = flat[offset:].view(rows, cols)  # contiguous; data_ptr 2 bytes past an aligned one when offset = 1
    t = torch.ops.tessera.transpose(w)
    assert t.shape == (cols, rows) and t.is_contiguous() and torch.equal(t, w.t())


# ---- CUDA graphs ------------------------------------------------------------------------------------------------
def test_cuda_graph_replay_equals_eager(world, ctx):
    """A forward through the TP modules captured once (automatic takes its measured or nearest choice there, else
    sequential), replayed 1000 times on fresh inputs, against eager calls of the same modules; then again after an
    eager call grew the workspaces."""
    rank, w, dev = world
    torch.manual_seed(5)
    col = tt.ColumnParallelLinear(512, 1024, ctx, bias=False)
    row = tt.RowParallelLinear(1024, 512, ctx, bias=True)
    mlp = tt.TensorParallelMLP(512, 1024, ctx)

    def forward(x):
        with torch.no_grad():
            return mlp(row(col(x)))

    static_x = randn(1024 // w, 512, seed=1, dev=dev)
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up: workspaces at their size, choices made
            forward(static_x)
    torch.cuda.current_stream(dev).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = forward(static_x)
    worst = 0.0
    for i in range(1000):
        static_x.copy_(randn(1024 // w, 512, seed=100 + i, dev=dev))
        graph.replay()
        if i % 50 == 0 or i == 999:
            eager = forward(static_x.clone())
            worst = max(worst, rel_err(static_y, eager))
    torch.cuda.synchronize(dev)
    assert worst < TOL, f"graph replay differs from eager by {worst}"
    # An eager call at a larger shape grows the workspaces; the graph keeps the ones it captured.
    forward(randn(4096 // w, 512, seed=7, dev=dev))
    static_x.copy_(randn(1024 // w, 512, seed=8, dev=dev))
    graph.replay()
    assert rel_err(static_y, forward(static_x.clone())) < TOL


def test_cuda_graph_of_overlapped_strategies_equals_eager(world):
    """The overlapped strategies under torch.cuda.graph: an MLP layer (AG+GEMM fused_ce, GEMM+RS fused_ce) and a
    GEMM+AR fused_ce, captured on their own context after one eager call, replayed on fresh inputs with eager calls
    of the same strategies in between; each replay equals the eager call on the same input exactly."""
    rank, w, dev = world
    if w < 2:
        pytest.skip(f"the overlapped strategies need 2 GPUs; world size is {w}")
    m, h, inter = 1024, 512, 768
    wgu = randn(2 * inter // w, h, seed=30 + rank, dev=dev, scale=0.1)
    wd = randn(h, inter // w, seed=40 + rank, dev=dev, scale=0.1)
    war = randn(h, 256, seed=50 + rank, dev=dev, scale=0.1)
    static_x = randn(m // w, h, seed=60, dev=dev)
    static_a = randn(256, 256, seed=70 + rank, dev=dev)
    with tt.Context() as c:
        def layer():
            y = c.mlp(static_x, wgu, wd, m=m, ag_strategy="fused_ce", rs_strategy="fused_ce")
            return y, c.gemm_ar(static_a, war, strategy="fused_ce")

        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            layer()  # workspaces at their size before the capture
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y, static_z = layer()
        for i in range(60):
            static_x.copy_(randn(m // w, h, seed=100 + i, dev=dev))
            static_a.copy_(randn(256, 256, seed=300 + 8 * i + rank, dev=dev))
            graph.replay()
            y, z = static_y.clone(), static_z.clone()
            if i % 6 == 0:
                ey, ez = layer()
                assert torch.equal(y, ey) and torch.equal(z, ez), f"replay {i} differs from the eager call"
        torch.cuda.synchronize(dev)
        ref_z = (static_a.float() @ war.float().t())
        dist.all_reduce(ref_z)
        assert rel_err(z, ref_z) < TOL
        del graph


# ---- contexts -------------------------------------------------------------------------------------------------
def test_two_contexts_with_fused_calls_in_flight(world):
    """Two contexts over the same ranks, each making host exchanges (the agreement check of a new strategy runs NCCL
    collectives) while the other's fused calls are queued behind sequential ones. The exchanges are ordered after
    every context's in-flight work: beside a persistent fused kernel that spins on its peers, an exchange's NCCL
    kernel could take the SMs it waits for on one rank, a deadlock across devices that the wait timeout turns into
    an unspecified launch failure (at R = 4, MLP-1, in 3 of 4 runs without the ordering)."""
    rank, w, dev = world
    if w < 2:
        pytest.skip(f"the fused strategies need 2 GPUs; world size is {w}")
    h, inter = 4096, 11008  # MLP-1's layer: calls of a few ms, so the host runs ahead of the GPU
    wgu = randn(2 * inter // w, h, seed=80 + rank, dev=dev, scale=0.05)
    wd = randn(h, inter // w, seed=90 + rank, dev=dev, scale=0.05)
    with tt.Context() as first, tt.Context() as second:
        for i, m_local in enumerate((8192 // w, 1088)):  # a new shape: new exchanges
            m = m_local * w
            x = randn(m_local, h, seed=200 + i, dev=dev)
            ys = []
            for strategy in ("sequential", "fused_ce"):  # nothing synchronizes between the calls
                for c in (first, second):
                    for _ in range(3):
                        ys.append(c.mlp(x, wgu, wd, m=m, ag_strategy=strategy, rs_strategy=strategy))
            torch.cuda.synchronize(dev)
            for y in ys[1:]:
                assert rel_err(y, ys[0]) < 1e-2, f"m = {m}: the calls disagree"


def test_context_over_world_and_over_a_one_rank_group(world, ctx):
    rank, w, dev = world
    mine = None
    for r in range(w):  # new_group is collective over the world, in the same order everywhere
        g = dist.new_group([r])
        if r == rank:
            mine = g
    with tt.Context(group=mine) as solo:
        assert (solo.rank, solo.world) == (0, 1) and (ctx.rank, ctx.world) == (rank, w)
        assert solo.handle != ctx.handle
        a, b = randn(256, 512, seed=10 + rank, dev=dev), randn(384, 512, seed=20 + rank, dev=dev)
        local = (a.float() @ b.float().t())
        y_solo = solo.gemm_ar(a, b, strategy="sequential")
        assert rel_err(y_solo, local) < TOL
        y_all = ctx.gemm_ar(a, b, strategy="sequential")
        ref = local.clone()
        dist.all_reduce(ref)
        assert rel_err(y_all, ref) < TOL
        torch.cuda.synchronize()
    assert solo.closed
    with pytest.raises(tt.TesseraError, match="closed"):
        solo.gemm_ar(a, b)


def test_bad_device_is_rejected_before_launch(ctx, world):
    _, _, dev = world
    a_cpu = torch.zeros(128, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"a is on cpu, but the context's device is cuda"):
        ctx.gemm_ar(a_cpu, torch.zeros(64, 64, dtype=torch.bfloat16, device=dev))
    with pytest.raises(TypeError, match="b has dtype torch.float16 but a has torch.bfloat16"):
        ctx.gemm_ar(a_cpu.to(dev), torch.zeros(64, 64, dtype=torch.float16, device=dev))


# ---- operators against torch.distributed collectives + matmul ------------------------------------------------
@pytest.mark.parametrize("strategy", ["sequential", "fused_ce"])
def test_ops_match_collectives(world, ctx, strategy):
    rank, w, dev = world
    m, k, n = 512 * w, 1024, 768
    ml = m // w
    a = randn(ml, k, seed=100 + rank, dev=dev)
    b = randn(n, k, seed=200 + rank, dev=dev)
    full_a = torch.empty(m, k, dtype=a.dtype, device=dev)
    dist.all_gather_into_tensor(full_a, a)
    y = ctx.ag_gemm(a, b, strategy=strategy)
    assert rel_err(y, full_a.float() @ b.float().t()) < TOL
    y2 = ctx.ag_gemm(a, b, swiglu=True, strategy=strategy)
    gu = full_a.float() @ b.float().t()
    assert rel_err(y2, F.silu(gu[:, 0::2]) * gu[:, 1::2]) < TOL
    # GEMM + RS: every rank's A is [M, K_r]
    a2 = randn(m, k, seed=300 + rank, dev=dev)
    part = (a2.float() @ b.float().t()).contiguous()
    ref = torch.empty(ml, n, dtype=torch.float32, device=dev)
    dist.reduce_scatter_tensor(ref, part)
    assert rel_err(ctx.gemm_rs(a2, b, strategy=strategy), ref) < TOL
    full = part.clone()
    dist.all_reduce(full)
    assert rel_err(ctx.gemm_ar(a2, b, strategy=strategy), full) < TOL


def test_mlp_op_matches_reference(world, ctx):
    rank, w, dev = world
    m, h, i_local = 256 * w, 1024, 512
    x = randn(m // w, h, seed=400 + rank, dev=dev)
    wgu = randn(2 * i_local, h, seed=500 + rank, dev=dev, scale=0.05)
    wd = randn(h, i_local, seed=600 + rank, dev=dev, scale=0.05)
    xf = torch.empty(m, h, dtype=x.dtype, device=dev)
    dist.all_gather_into_tensor(xf, x)
    gu = xf.float() @ wgu.float().t()
    hid = (F.silu(gu[:, 0::2]) * gu[:, 1::2]).bfloat16().float()
    part = (hid @ wd.float().t()).contiguous()
    ref = torch.empty(m // w, h, dtype=torch.float32, device=dev)
    dist.reduce_scatter_tensor(ref, part)
    assert rel_err(ctx.mlp(x, wgu, wd, ag_strategy="sequential", rs_strategy="sequential"), ref) < TOL


def test_ops_run_on_the_callers_stream(world, ctx):
    """The input is produced on a side stream behind a long GPU sleep; the operator, called right after on that
    stream, must see it (a private unordered stream would read the zeros)."""
    rank, w, dev = world
    m, k, n = 512 * w, 512, 512
    src = randn(m // w, k, seed=700 + rank, dev=dev)
    b = randn(n, k, seed=800, dev=dev)
    side = torch.cuda.Stream(dev)
    x = torch.zeros_like(src)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # ~25 ms of GPU time
        x.copy_(src)
        y = ctx.ag_gemm(x, b, strategy="sequential")
        done = torch.cuda.Event()
        done.record(side)
    done.synchronize()
    full = torch.empty(m, k, dtype=src.dtype, device=dev)
    dist.all_gather_into_tensor(full, src)
    assert rel_err(y, full.float() @ b.float().t()) < TOL


# ---- modules against nn.Linear on the whole layer --------------------------------------------------------------
class Block(torch.nn.Module):
    """The linear layers' backward (dX: the weight passed as B [K, N], b_kn) runs `backward`; the MLP runs it in
    both directions (its backward's strategies are its forward's)."""
    def __init__(self, ctx, h, f, bias, backward="sequential"):
        super().__init__()
        self.fc1 = tt.ColumnParallelLinear(h, f, ctx, bias=bias, strategy="sequential", backward_strategy=backward)
        self.fc2 = tt.RowParallelLinear(f, h, ctx, bias=bias, strategy="sequential", backward_strategy=backward)
        self.mlp = tt.TensorParallelMLP(h, f, ctx, strategy=backward)

    def forward(self, x):
        return self.mlp(self.fc2(F.gelu(self.fc1(x))))


class RefBlock(torch.nn.Module):
    def __init__(self, h, f, bias, dev):
        super().__init__()
        kw = dict(dtype=torch.bfloat16, device=dev)
        self.fc1, self.fc2 = torch.nn.Linear(h, f, bias=bias, **kw), torch.nn.Linear(f, h, bias=bias, **kw)
        self.gate = torch.nn.Linear(h, f, bias=False, **kw)
        self.up = torch.nn.Linear(h, f, bias=False, **kw)
        self.down = torch.nn.Linear(f, h, bias=False, **kw)

    def forward(self, x):
        y = self.fc2(F.gelu(self.fc1(x)))
        return self.down(F.silu(self.gate(y)) * self.up(y))


def check_modules(world, ctx, bias, compiled, m=1024, h=512, f=1024, backward="sequential"):
    rank, w, dev = world
    torch.manual_seed(1234)  # the same full weights and data on every rank
    ref = RefBlock(h, f, bias, dev)
    tes = Block(ctx, h, f, bias, backward)
    tes.fc1.load_full(ref.fc1.weight, ref.fc1.bias)
    tes.fc2.load_full(ref.fc2.weight, ref.fc2.bias)
    tes.mlp.load_full(ref.gate.weight, ref.up.weight, ref.down.weight)
    x = randn(m, h, seed=5, dev=dev)
    dy = randn(m, h, seed=6, dev=dev)
    lo, hi = rank * (m // w), (rank + 1) * (m // w)
    xr = x.clone().requires_grad_(True)
    yr = ref(xr)
    yr.backward(dy)
    model = torch.compile(tes, fullgraph=True, backend="aot_eager") if compiled else tes
    xs = x[lo:hi].clone().requires_grad_(True)
    ys = model(xs)
    ys.backward(dy[lo:hi].contiguous())
    torch.cuda.synchronize()
    errs = {"output": rel_err(ys, yr[lo:hi]), "dx": rel_err(xs.grad, xr.grad[lo:hi])}
    n1, k2, i = f // w, f // w, f // w
    errs["fc1.weight"] = rel_err(tes.fc1.weight.grad, ref.fc1.weight.grad[rank * n1:(rank + 1) * n1])
    errs["fc2.weight"] = rel_err(tes.fc2.weight.grad, ref.fc2.weight.grad[:, rank * k2:(rank + 1) * k2])
    errs["mlp.w_down"] = rel_err(tes.mlp.w_down.grad, ref.down.weight.grad[:, rank * i:(rank + 1) * i])
    errs["mlp.w_gate_up"] = rel_err(tes.mlp.w_gate_up.grad,
                                    tt.fuse_gate_up(ref.gate.weight.grad[rank * i:(rank + 1) * i],
                                                    ref.up.weight.grad[rank * i:(rank + 1) * i]))
    if bias:
        errs["fc1.bias"] = rel_err(tes.fc1.bias.grad, ref.fc1.bias.grad[rank * n1:(rank + 1) * n1])
        errs["fc2.bias"] = rel_err(tes.fc2.bias.grad, ref.fc2.bias.grad)
    print(f"[rank {rank}/{w}] bias={bias} compiled={compiled} backward={backward} rel errors:",
          " ".join(f"{k}={v:.2e}" for k, v in errs.items()))
    bad = {k: v for k, v in errs.items() if not v < TOL}
    assert not bad, f"over {TOL}: {bad}"


@pytest.mark.parametrize("bias", [False, True])
def test_modules_match_nn_linear(world, ctx, bias):
    check_modules(world, ctx, bias, compiled=False)


# The backward's dX GEMMs take the weight itself as B [K, N] (b_kn): every strategy's B-as-[K, N] kernel
# (cuBLASLt for sequential/decomposition, the fused engine's KN instantiations for fused_ce/fused_sm).
@pytest.mark.parametrize("backward", ["decomposition", "fused_ce", "fused_sm"])
def test_modules_backward_strategies_match_nn_linear(world, ctx, backward):
    if world[1] < 2:
        pytest.skip(f"the overlapped strategies need 2 GPUs; world size is {world[1]}")
    check_modules(world, ctx, True, compiled=False, backward=backward)


def test_modules_compiled_fullgraph(world, ctx):
    check_modules(world, ctx, True, compiled=True)
    _, tes_x = None, None
    blk = Block(ctx, 512, 1024, True)
    x = randn(1024 // world[1], 512, seed=7, dev=world[2])
    ex = torch._dynamo.explain(blk)(x)
    assert ex.graph_break_count == 0, ex.break_reasons


@pytest.mark.parametrize("bias", [False, True])
def test_tp2_modules_match_nn_linear(world, ctx, bias):
    if world[1] < 2:
        pytest.skip(f"TP=2 check needs 2 GPUs; world size is {world[1]} (awaits an nvidia-h200-x2 run)")
    check_modules(world, ctx, bias, compiled=False, m=2048, h=1024, f=2048)


def test_tp2_one_rank_groups_inside_the_world(world):
    rank, w, dev = world
    if w < 2:
        pytest.skip(f"needs 2 GPUs; world size is {w}")
    pairs = [list(range(i, min(i + 2, w))) for i in range(0, w, 2)]
    mine = None
    for p in pairs:
        g = dist.new_group(p)
        if rank in p:
            mine = g
    with tt.Context(group=mine) as sub:
        assert sub.world == len([p for p in pairs if rank in p][0])
        a, b = randn(256, 256, seed=rank, dev=dev), randn(256, 256, seed=99, dev=dev)
        y = sub.gemm_ar(a, b, strategy="sequential")
        ref = (a.float() @ b.float().t())
        dist.all_reduce(ref, group=mine)
        assert rel_err(y, ref) < TOL


# ---- the decoder layer against the same layer in plain PyTorch ------------------------------------------------
def test_decoder_layer_matches_plain_pytorch(world, ctx):
    from tessera.torch.layers import attention, rms_norm, rope
    rank, w, dev = world
    h, inter, heads, kv, m = 512, 1024, 8, 4, 512 * w
    d = h // heads
    torch.manual_seed(4321)  # the same full weights and data on every rank
    kw = dict(bias=False, dtype=torch.bfloat16, device=dev)
    q, k, v, o = (torch.nn.Linear(h, heads * d, **kw), torch.nn.Linear(h, kv * d, **kw),
                  torch.nn.Linear(h, kv * d, **kw), torch.nn.Linear(heads * d, h, **kw))
    gate, up, down = torch.nn.Linear(h, inter, **kw), torch.nn.Linear(h, inter, **kw), torch.nn.Linear(inter, h, **kw)
    ln1 = torch.nn.Parameter((1 + 0.1 * torch.randn(h, device=dev)).bfloat16())
    ln2 = torch.nn.Parameter((1 + 0.1 * torch.randn(h, device=dev)).bfloat16())

    def plain(x):
        hn = rms_norm(x, ln1, 1e-5)
        qq = q(hn).reshape(m, heads, d).transpose(0, 1)
        kk = k(hn).reshape(m, kv, d).transpose(0, 1)
        vv = v(hn).reshape(m, kv, d).transpose(0, 1)
        x = x + o(attention(rope(qq), rope(kk), vv).transpose(0, 1).reshape(m, -1))
        hn = rms_norm(x, ln2, 1e-5)
        return x + down(F.silu(gate(hn)) * up(hn))

    layer = tt.TensorParallelDecoderLayer(h, inter, heads, kv, ctx, strategy="sequential")
    layer.load_full(q.weight, k.weight, v.weight, o.weight, gate.weight, up.weight, down.weight, ln1, ln2)
    x = randn(m, h, seed=11, dev=dev)
    lo, hi = rank * (m // w), (rank + 1) * (m // w)
    xr = x.clone().requires_grad_(True)
    yr = plain(xr)
    yr.float().square().sum().backward()
    xs = x[lo:hi].clone().requires_grad_(True)
    ys = layer(xs)
    ys.float().square().sum().backward()
    layer.allreduce_sequence_parallel_grads()
    torch.cuda.synchronize()
    hq, hk = heads // w, kv // w
    ref_qkv = torch.cat((q.weight.grad[rank * hq * d:(rank + 1) * hq * d], k.weight.grad[rank * hk * d:(rank + 1) * hk * d],
                         v.weight.grad[rank * hk * d:(rank + 1) * hk * d]))
    i = inter // w
    errs = {"output": rel_err(ys, yr[lo:hi]), "dx": rel_err(xs.grad, xr.grad[lo:hi]),
            "qkv": rel_err(layer.qkv.weight.grad, ref_qkv),
            "o": rel_err(layer.o.weight.grad, o.weight.grad[:, rank * hq * d:(rank + 1) * hq * d]),
            "down": rel_err(layer.mlp.w_down.grad, down.weight.grad[:, rank * i:(rank + 1) * i]),
            "ln1": rel_err(layer.ln1.grad, ln1.grad), "ln2": rel_err(layer.ln2.grad, ln2.grad)}
    print(f"[rank {rank}/{w}] decoder layer rel errors:", " ".join(f"{a}={b:.2e}" for a, b in errs.items()))
    bad = {a: b for a, b in errs.items() if not b < TOL}
    assert not bad, f"over {TOL}: {bad}"


# ---- sequence-parallel attention --------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["sequential", "fused_ce", "ring", "ulysses", "two_level", "automatic"])
@pytest.mark.parametrize("causal", [True, False])
def test_sp_attention_matches_whole_sequence_attention(world, ctx, strategy, causal):
    """Zig-zag shards of one global problem (same seed on every rank) against float32 attention on the whole
    sequence: O, LSE, and the unsharded O gathered from every rank."""
    rank, w, dev = world
    S, hq, hkv, d = 384 * 2 * w, 8, 2, 128
    if strategy == "ulysses" and (hq % w or hkv % w):
        pytest.skip(f"ulysses needs the heads ({hq}/{hkv}) to be multiples of the world ({w})")
    q, k, v = (randn(1, S, h, d, seed=s, dev=dev) for s, h in ((30, hq), (31, hkv), (32, hkv)))
    qs, ks, vs = (tt.zigzag_shard(t, w, rank) for t in (q, k, v))
    o, lse = tt.sp_attention(qs, ks, vs, ctx, causal=causal, strategy=strategy, return_lse=True)
    assert o.shape == qs.shape and lse.shape == (1, hq, S // w) and lse.dtype == torch.float32
    qf = q.float().transpose(1, 2)
    kf, vf = (t.float().repeat_interleave(hq // hkv, dim=2).transpose(1, 2) for t in (k, v))
    s = qf @ kf.transpose(-1, -2) / d ** 0.5
    if causal:
        s = s.masked_fill(torch.ones(S, S, dtype=torch.bool, device=dev).triu(1), float("-inf"))
    ref = (torch.softmax(s, dim=-1) @ vf).transpose(1, 2)
    ref_lse = torch.logsumexp(s, dim=-1)
    assert rel_err(o, tt.zigzag_shard(ref, w, rank)) < TOL
    assert (lse - tt.zigzag_shard(ref_lse, w, rank, dim=2)).abs().max().item() < 1e-2
    shards = [torch.empty_like(o) for _ in range(w)]
    dist.all_gather(shards, o)
    assert rel_err(tt.zigzag_unshard(shards), ref) < TOL
    o2 = tt.sp_attention(qs, ks, vs, ctx, causal=causal, strategy=strategy)  # O only, a second call (epochs)
    assert rel_err(o2, o) < 1e-3
    if strategy == "automatic":
        assert tt.resolve_sp_attention(qs, ks, vs, ctx, causal=causal) in ("sequential", "fused_ce", "ring", "ulysses",
                                                                           "two_level")


@pytest.mark.parametrize("strategy", ["sequential", "fused_ce"])
def test_sp_attention_cuda_graph_equals_eager(world, strategy):
    """sp_attention under torch.cuda.graph on its own context after one eager call: replays on fresh inputs equal
    the eager call on the same input exactly, with eager calls between them."""
    rank, w, dev = world
    if strategy == "fused_ce" and w < 2:
        pytest.skip(f"fused_ce overlaps transfers between 2 GPUs; world size is {w}")
    S, hq, hkv, d = 256 * 2 * w, 4, 2, 128

    def shards(seed):
        return [tt.zigzag_shard(randn(1, S, h, d, seed=seed + j, dev=dev), w, rank)
                for j, h in enumerate((hq, hkv, hkv))]

    static = shards(500)
    with tt.Context() as c:
        def call():
            return tt.sp_attention(*static, c, causal=True, strategy=strategy, return_lse=True)

        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            call()  # workspaces at their size, shapes agreed, before the capture
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_o, static_lse = call()
        for i in range(24):
            for t, src in zip(static, shards(600 + 10 * i)):
                t.copy_(src)
            graph.replay()
            o, lse = static_o.clone(), static_lse.clone()
            if i % 4 == 0:
                eo, else_lse = call()
                assert torch.equal(o, eo) and torch.equal(lse, else_lse), f"replay {i} differs from the eager call"
        torch.cuda.synchronize(dev)
        del graph


def test_sp_attention_under_a_workspace_limit(world):
    """A context whose sp_attention workspace is capped at fused_ce's need: sequential (which also stages NCCL's
    gather) is refused before launch, automatic runs a schedule that fits and matches an uncapped call."""
    rank, w, dev = world
    if w < 2:
        pytest.skip("one rank moves nothing")
    S, hq, hkv, d = 384 * 2 * w, 8, 2, 128
    q, k, v = (randn(1, S, h, d, seed=s, dev=dev) for s, h in ((40, hq), (41, hkv), (42, hkv)))
    qs, ks, vs = (tt.zigzag_shard(t, w, rank) for t in (q, k, v))
    fused_need_gb = 2 * S * hkv * d * 2 / (1 << 30)  # the gathered K and V
    with tt.Context(sp_workspace_limit_gb=fused_need_gb) as capped, tt.Context() as free:
        with pytest.raises(Exception, match="over the limit"):
            tt.sp_attention(qs, ks, vs, capped, causal=True, strategy="sequential")
        o = tt.sp_attention(qs, ks, vs, capped, causal=True, strategy="automatic")
        ref = tt.sp_attention(qs, ks, vs, free, causal=True, strategy="sequential")
        assert rel_err(o, ref) < TOL
        assert tt.resolve_sp_attention(qs, ks, vs, capped, causal=True) != "sequential"


def test_sp_attention_rejects_bad_input_before_launch(world, ctx):
    rank, w, dev = world
    q = randn(1, 256, 6, 128, seed=1, dev=dev)
    kv = randn(1, 256, 4, 128, seed=2, dev=dev)
    with pytest.raises(ValueError, match="heads_q = 6 is not a multiple of heads_kv = 4"):
        tt.sp_attention(q, kv, kv, ctx)
    with pytest.raises(ValueError, match="strategy 2"):
        torch.ops.tessera.sp_attention(q, q, q, ctx.handle, True, 0.0, 2)


# ---- Mixture-of-Experts layers ---------------------------------------------------------------------------------
def moe_reference(x, ids, weights, w_gate_up, w_down):
    """float32: per expert y = w_down · (SiLU(gate) · up) of its routed tokens (gate/up rows interleaved), summed
    with the gate weights; ids outside [0, E) contribute nothing."""
    out = torch.zeros(x.shape[0], w_down.shape[1], dtype=torch.float32, device=x.device)
    for e in range(w_gate_up.shape[0]):
        tok, slot = (ids == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        gu = x[tok].float() @ w_gate_up[e].float().t()
        y = (F.silu(gu[:, 0::2]) * gu[:, 1::2]) @ w_down[e].float().t()
        out.index_add_(0, tok, y * weights[tok, slot, None])
    return out


def moe_routing(t, e, k, skewed, seed, dev):
    """uniform: the router's top-k of random logits (tessera::moe_topk, checked against the float32 router);
    skewed: slot 0 always expert 0, the others spread over 1 .. e-2, so expert e-1 gets no token on any rank."""
    g = torch.Generator(device=dev).manual_seed(seed)
    if not skewed:
        logits = torch.randn(t, e, generator=g, device=dev)
        ids, w = tt.moe_topk(logits, k)
        ref_ids, ref_w = tt._ops.moe_topk_reference(logits, k)
        assert torch.equal(ids, ref_ids) and (w - ref_w).abs().max().item() < 1e-5
        return ids, w
    ids = torch.randint(1, e - 1, (t, k), generator=g, device=dev, dtype=torch.int32)
    ids[:, 0] = 0
    w = torch.rand(t, k, generator=g, device=dev) + 0.1
    return ids, w / w.sum(-1, keepdim=True)


def moe_weights(e, inter, h, dev, seed=900):
    """Full layer weights, the same on every rank: fused gate/up [E, 2I, H] (rows interleaved) and down [E, H, I]."""
    w_gate = randn(e, inter, h, seed=seed, dev=dev, scale=h ** -0.5)
    w_up = randn(e, inter, h, seed=seed + 1, dev=dev, scale=h ** -0.5)
    w_down = randn(e, h, inter, seed=seed + 2, dev=dev, scale=inter ** -0.5)
    return w_gate, w_up, w_down, tt.fuse_gate_up_experts(w_gate, w_up)


def poisoned_call(fn, like):
    """Runs fn with the caching allocator's next block of `like`'s size NaN-filled, so an output row the layer
    never writes shows as NaN."""
    poison = torch.full_like(like, float("nan"))
    del poison
    return fn()


def gather_rows(t):
    out = torch.empty((t.shape[0] * dist.get_world_size(),) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
    dist.all_gather_into_tensor(out, t.contiguous())
    return out


@pytest.mark.parametrize("strategy", ["sequential", "pipelined", "automatic"])
@pytest.mark.parametrize("skewed", [False, True])
def test_moe_tp_matches_reference(world, ctx, strategy, skewed):
    """Every rank holds every expert's I / R shard: the float32 reference all-gathers the tokens and routing, runs
    the rank's shard of every expert, and reduce-scatters the partial sums."""
    rank, w, dev = world
    t, h, inter, e, k = 96, 256, 128 * w, 8, 2
    il = inter // w
    _, _, w_down, w_gate_up = moe_weights(e, inter, h, dev)
    wgu_r = w_gate_up[:, 2 * rank * il:2 * (rank + 1) * il].contiguous()  # the rank's interleaved gate/up rows
    wd_r = w_down[:, :, rank * il:(rank + 1) * il].contiguous()
    x = randn(t, h, seed=1000 + rank, dev=dev)
    ids, gw = moe_routing(t, e, k, skewed, 1100 + rank, dev)
    part = moe_reference(gather_rows(x), gather_rows(ids), gather_rows(gw), wgu_r, wd_r)
    ref = torch.empty(t, h, dtype=torch.float32, device=dev)
    dist.reduce_scatter_tensor(ref, part)
    y = poisoned_call(lambda: ctx.moe_tp(x, ids, gw, wgu_r, wd_r, strategy=strategy), x)
    ctx.moe_tp_check_status()
    assert y.shape == x.shape and y.dtype == torch.bfloat16
    assert not y.isnan().any()
    assert rel_err(y, ref) < TOL
    y2 = ctx.moe_tp(x, ids, gw, wgu_r, wd_r, strategy=strategy)  # a second call (epochs, cached buffers)
    ctx.moe_tp_check_status()
    assert rel_err(y2, y) < 1e-3
    if strategy == "automatic":
        assert ctx.resolve_moe_tp(x, ids, gw, wgu_r, wd_r) in ("sequential", "pipelined")


@pytest.mark.parametrize("strategy", ["sequential", "pipelined", "automatic"])
@pytest.mark.parametrize("skewed", [False, True])
def test_moe_ep_matches_reference(world, ctx, strategy, skewed):
    """Rank r owns experts [r·E/R, (r+1)·E/R) whole; the reference runs every expert on the rank's own tokens."""
    rank, w, dev = world
    t, h, inter, e, k = 96, 256, 128, 4 * w, 2
    el = e // w
    _, _, w_down, w_gate_up = moe_weights(e, inter, h, dev)
    wgu_r, wd_r = w_gate_up[rank * el:(rank + 1) * el].contiguous(), w_down[rank * el:(rank + 1) * el].contiguous()
    x = randn(t, h, seed=1200 + rank, dev=dev)
    ids, gw = moe_routing(t, e, k, skewed, 1300 + rank, dev)
    ref = moe_reference(x, ids, gw, w_gate_up, w_down)
    y = poisoned_call(lambda: ctx.moe_ep(x, ids, gw, wgu_r, wd_r, strategy=strategy), x)
    ctx.moe_ep_check_status()
    assert y.shape == x.shape and not y.isnan().any()
    assert rel_err(y, ref) < TOL
    y2 = ctx.moe_ep(x, ids, gw, wgu_r, wd_r, capacity=t * k, strategy=strategy)  # the default capacity, explicit
    ctx.moe_ep_check_status()
    assert rel_err(y2, y) < 1e-3


def test_moe_invalid_expert_id_and_overflow_are_reported(world, ctx):
    """An id outside [0, E) is left out and reported by check_status (never silently); so is moe_ep's capacity
    overflow. A good call afterwards reports nothing."""
    rank, w, dev = world
    t, h, inter, e, k = 64, 128, 64 * w, 4 * w, 2
    il, el = inter // w, e // w
    _, _, w_down, w_gate_up = moe_weights(e, inter, h, dev)
    x = randn(t, h, seed=1400 + rank, dev=dev)
    ids, gw = moe_routing(t, e, k, False, 1500 + rank, dev)
    bad = ids.clone()
    bad[3, 1] = e  # one invalid id on every rank
    tp_w = (w_gate_up[:, 2 * rank * il:2 * (rank + 1) * il].contiguous(), w_down[:, :, rank * il:(rank + 1) * il]
            .contiguous())
    ep_w = (w_gate_up[rank * el:(rank + 1) * el].contiguous(), w_down[rank * el:(rank + 1) * el].contiguous())
    ctx.moe_tp(x, bad, gw, *tp_w, strategy="sequential")
    with pytest.raises(tt.TesseraError, match=r"moe_tp: \d+ routed entries had an expert id outside \[0, experts\)"):
        ctx.moe_tp_check_status()
    ctx.moe_tp(x, ids, gw, *tp_w, strategy="sequential")
    ctx.moe_tp_check_status()
    y = ctx.moe_ep(x, bad, gw, *ep_w, strategy="sequential")
    with pytest.raises(tt.TesseraError, match=r"moe_ep: rank \d+; 1 routed entries had an expert id outside"):
        ctx.moe_ep_check_status()
    assert rel_err(y, moe_reference(x, bad, gw, w_gate_up, w_down)) < TOL  # the invalid entry left out
    if w > 1:
        skew = torch.zeros_like(ids)  # every entry to rank 0's first expert: t·k rows for rank 0
        skew[:, 1] = 1
        ctx.moe_ep(x, skew, gw, *ep_w, capacity=t, strategy="sequential")
        with pytest.raises(tt.TesseraError, match="capacity overflow"):
            ctx.moe_ep_check_status()
    ctx.moe_ep(x, ids, gw, *ep_w, strategy="sequential")
    ctx.moe_ep_check_status()


def test_moe_runs_on_the_callers_stream(world, ctx):
    """The input is produced on a side stream behind a long GPU sleep; moe_tp, called right after on that stream,
    must see it."""
    rank, w, dev = world
    t, h, inter, e, k = 64, 128, 64 * w, 8, 2
    il = inter // w
    _, _, w_down, w_gate_up = moe_weights(e, inter, h, dev)
    wgu_r = w_gate_up[:, 2 * rank * il:2 * (rank + 1) * il].contiguous()
    wd_r = w_down[:, :, rank * il:(rank + 1) * il].contiguous()
    src = randn(t, h, seed=1600 + rank, dev=dev)
    ids, gw = moe_routing(t, e, k, False, 1700 + rank, dev)
    ref = ctx.moe_tp(src, ids, gw, wgu_r, wd_r, strategy="sequential")
    side = torch.cuda.Stream(dev)
    x = torch.zeros_like(src)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        x.copy_(src)
        y = ctx.moe_tp(x, ids, gw, wgu_r, wd_r, strategy="sequential")
        done = torch.cuda.Event()
        done.record(side)
    done.synchronize()
    assert rel_err(y, ref) < 1e-3


def test_moe_rejects_bad_input_before_launch(world, ctx):
    _, w, dev = world
    x = randn(16, 64, seed=1, dev=dev)
    ids = torch.zeros(16, 2, dtype=torch.int32, device=dev)
    gw = torch.full((16, 2), 0.5, device=dev)
    wgu, wd = randn(4, 16, 64, seed=2, dev=dev), randn(4, 64, 8, seed=3, dev=dev)
    with pytest.raises(ValueError, match="tessera::moe_tp: x is on cpu, but the context's device is cuda"):
        ctx.moe_tp(x.cpu(), ids, gw, wgu, wd)
    with pytest.raises(ValueError, match="tessera::moe_tp: expert_ids is on cpu"):
        ctx.moe_tp(x, ids.cpu(), gw, wgu, wd)
    with pytest.raises(TypeError, match="tessera::moe_ep: expert_ids has dtype torch.int64"):
        ctx.moe_ep(x, ids.long(), gw, wgu, wd)
    with pytest.raises(ValueError, match="tessera::moe_tp: x is not 16-byte aligned"):
        ctx.moe_tp(randn(17 * 64 + 4, seed=4, dev=dev)[4:].view(17, 64)[:16], ids, gw, wgu, wd)


def test_moe_layer_matches_reference_and_has_no_backward(world, ctx):
    rank, w, dev = world
    t, h, inter, e, k = 64, 256, 128 * w, 8, 2
    w_gate, w_up, w_down, w_gate_up = moe_weights(e, inter, h, dev)
    router = randn(e, h, seed=1800, dev=dev)
    layer = tt.TensorParallelMoE(h, inter, e, k, ctx, strategy="sequential").load_full(w_gate, w_up, w_down, router)
    x = randn(t, h, seed=1900 + rank, dev=dev)
    with torch.no_grad():
        y = layer(x)
    with torch.no_grad():
        logits = F.linear(x, layer.router)
        ids, gw = layer.route(x)  # the library's router (bf16 logits may tie; ties go to the lower id there)
    ref_ids, ref_gw = tt._ops.moe_topk_reference(logits, k)
    assert (ids == ref_ids).float().mean().item() > 0.9 and (gw - ref_gw).abs()[ids == ref_ids].max().item() < 1e-4
    xs, idss, gws = gather_rows(x), gather_rows(ids), gather_rows(gw)
    ref_all = moe_reference(xs, idss, gws, w_gate_up, w_down)
    assert rel_err(y, ref_all[rank * t:(rank + 1) * t]) < TOL
    with pytest.raises(RuntimeError, match="no autograd formula"):
        layer(x.clone().requires_grad_(True)).float().sum().backward()
