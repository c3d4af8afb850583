"""CPU tests of the Mixture-of-Experts ops and layer of tessera.torch (no GPU).

* tessera::moe_tp, moe_ep and moe_topk: fake (meta) shapes at world sizes 1..4, argument checks before any launch
  (ValueError / TypeError naming the argument), the strategy codes they take (the strategy table's, checked against
  the library when it loads).
* No backward: a backward through the ops raises instead of returning gradients.
* TensorParallelMoE at TP = 1 against a plain PyTorch MoE built from the full weights, through CPU reference kernels
  registered here for one-rank contexts (the library's kernels are CUDA only); at world 2 on the meta device: shapes.
"""
import ctypes

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the torch front-end tests need it")

import tessera  # noqa: E402
import tessera.torch as tt  # noqa: E402
from tessera.torch import _context, _ops  # noqa: E402

F = torch.nn.functional
BF16 = torch.bfloat16


def moe_reference(x, ids, weights, w_gate_up, w_down):
    """float32: per expert y = w_down · (SiLU(gate) · up) of its tokens, summed with the gate weights."""
    out = torch.zeros(x.shape[0], w_down.shape[1], dtype=torch.float32, device=x.device)
    for e in range(w_gate_up.shape[0]):
        tok, slot = (ids == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        gu = x[tok].float() @ w_gate_up[e].float().t()
        y = (F.silu(gu[:, 0::2]) * gu[:, 1::2]) @ w_down[e].float().t()
        out.index_add_(0, tok, y * weights[tok, slot, None])
    return out


# ---- CPU reference kernels for one-rank contexts (test only) ---------------------------------------------------
def _ref_moe_tp(x, ids, weights, w_gate_up, w_down, ctx, strategy=0):
    assert _context.lookup(ctx).world == 1, "the CPU reference kernels model a one-rank group only"
    return moe_reference(x, ids, weights, w_gate_up, w_down).to(x.dtype)


torch.library.register_kernel("tessera::moe_tp", "cpu", _ref_moe_tp)
torch.library.register_kernel("tessera::moe_topk", "cpu", _ops.moe_topk_reference)


@pytest.fixture
def ctx1():
    c = tt.Context._for_shapes(rank=0, world=1)
    yield c
    c.close()


def ctx_at(world, rank=0, device="cpu"):
    return tt.Context._for_shapes(rank=rank, world=world, device=device)


def moe_args(t=6, h=16, i=8, e=4, k=2, e_local=None, device="meta"):
    e_local = e if e_local is None else e_local
    return dict(x=torch.empty(t, h, dtype=BF16, device=device),
                expert_ids=torch.zeros(t, k, dtype=torch.int32, device=device),
                weights=torch.empty(t, k, dtype=torch.float32, device=device),
                w_gate_up=torch.empty(e_local, 2 * i, h, dtype=BF16, device=device),
                w_down=torch.empty(e_local, h, i, dtype=BF16, device=device))


def call(op, a, ctx, **kw):
    args = (a["x"], a["expert_ids"], a["weights"], a["w_gate_up"], a["w_down"], ctx.handle)
    if op == "moe_ep":
        return torch.ops.tessera.moe_ep(*args, kw.get("capacity", 0), kw.get("strategy", 0))
    return torch.ops.tessera.moe_tp(*args, kw.get("strategy", 0))


# ---- fake shapes ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_fake_shapes(world):
    for rank in range(world):
        c = ctx_at(world, rank)
        try:
            a = moe_args(t=5 + rank, e=4 * world)
            y = call("moe_tp", a, c)
            assert y.shape == (5 + rank, 16) and y.dtype == BF16 and y.device.type == "meta"
            ep = moe_args(t=3, e_local=4)  # 4 experts per rank: E = 4 · world
            assert call("moe_ep", ep, c, capacity=7).shape == (3, 16)
            assert c.moe_tp(a["x"], a["expert_ids"], a["weights"], a["w_gate_up"], a["w_down"]).shape == (5 + rank, 16)
            assert c.moe_ep(ep["x"], ep["expert_ids"], ep["weights"], ep["w_gate_up"], ep["w_down"],
                            strategy="pipelined").shape == (3, 16)
        finally:
            c.close()


def test_fake_shapes_of_an_empty_shard(ctx1):
    a = moe_args(t=0)
    assert call("moe_tp", a, ctx1).shape == (0, 16)
    assert call("moe_ep", a, ctx1).shape == (0, 16)


def test_topk_fake_shapes():
    for dt in (torch.float32, BF16, torch.float16):
        ids, w = torch.ops.tessera.moe_topk(torch.empty(9, 8, dtype=dt, device="meta"), 3, True)
        assert ids.shape == (9, 3) and ids.dtype == torch.int32
        assert w.shape == (9, 3) and w.dtype == torch.float32


def test_fake_tensor_mode_traces_the_ops():
    a = moe_args(device="cpu")
    c = ctx_at(2)
    try:
        with torch._subclasses.FakeTensorMode() as mode:
            fa = {k: mode.from_tensor(v) for k, v in a.items()}
            assert call("moe_tp", fa, c).shape == (6, 16)
            assert call("moe_ep", fa, c).shape == (6, 16)
            ids, w = torch.ops.tessera.moe_topk(mode.from_tensor(torch.randn(6, 4)), 2, False)
            assert ids.shape == (6, 2) and w.dtype == torch.float32
    finally:
        c.close()


# ---- argument checks ------------------------------------------------------------------------------------------
def _edit(**changes):
    def f(a):
        a.update(changes)
        return a
    return f


BAD = [
    ("x fp16", _edit(x=torch.empty(6, 16, dtype=torch.float16, device="meta")), TypeError,
     "x has dtype torch.float16; the MoE layers take bf16 only"),
    ("x fp32", _edit(x=torch.empty(6, 16, device="meta")), TypeError, "x has dtype torch.float32; bf16 or fp16 only"),
    ("x 3-D", _edit(x=torch.empty(1, 6, 16, dtype=BF16, device="meta")), ValueError, "x must be 2-D"),
    ("x strided", _edit(x=torch.empty(16, 6, dtype=BF16, device="meta").t()), ValueError,
     r"x must be contiguous \(row-major\)"),
    ("weights fp16", _edit(w_gate_up=torch.empty(4, 16, 16, dtype=torch.float16, device="meta"),
                           w_down=torch.empty(4, 16, 8, dtype=torch.float16, device="meta")), TypeError,
     "w_gate_up has dtype torch.float16 but x has torch.bfloat16"),
    ("w_down dtype", _edit(w_down=torch.empty(4, 16, 8, dtype=torch.float16, device="meta")), TypeError,
     "w_down has dtype torch.float16 but w_gate_up has torch.bfloat16"),
    ("ids int64", _edit(expert_ids=torch.zeros(6, 2, dtype=torch.int64, device="meta")), TypeError,
     "expert_ids has dtype torch.int64; it must be torch.int32"),
    ("weights bf16", _edit(weights=torch.empty(6, 2, dtype=BF16, device="meta")), TypeError,
     "weights has dtype torch.bfloat16; it must be torch.float32"),
    ("ids 1-D", _edit(expert_ids=torch.zeros(12, dtype=torch.int32, device="meta")), ValueError,
     r"expert_ids must be 2-D \[tokens_local, topk\]"),
    ("ids rows", _edit(expert_ids=torch.zeros(5, 2, dtype=torch.int32, device="meta")), ValueError,
     "expert_ids has 5 rows but x has 6 tokens"),
    ("ids strided", _edit(expert_ids=torch.zeros(2, 6, dtype=torch.int32, device="meta").t()), ValueError,
     "expert_ids must be contiguous"),
    ("weights shape", _edit(weights=torch.empty(6, 3, device="meta")), ValueError,
     r"weights is \(6, 3\) but expert_ids is \(6, 2\)"),
    ("w_down hidden", _edit(w_down=torch.empty(4, 24, 8, dtype=BF16, device="meta")), ValueError,
     r"w_down is \(4, 24, 8\), expected \(experts, hidden = 16, inter_local\)"),
    ("w_gate_up inter", _edit(w_gate_up=torch.empty(4, 8, 16, dtype=BF16, device="meta")), ValueError,
     r"w_gate_up is \(4, 8, 16\), expected \(4, 16, 16\)"),
    ("w_gate_up experts", _edit(w_gate_up=torch.empty(3, 16, 16, dtype=BF16, device="meta")), ValueError,
     r"w_gate_up is \(3, 16, 16\), expected \(4, 16, 16\)"),
    ("hidden % 8", lambda a: moe_args(h=12), ValueError, "hidden = 12 must be a positive multiple of 8"),
    ("inter % 8", lambda a: moe_args(i=4), ValueError, "inter_local = 4 must be a positive multiple of 8"),
    ("experts", lambda a: moe_args(e=1025, k=2), ValueError, r"experts = 1025 out of range \[1, 1024\]"),
    ("topk > experts", lambda a: moe_args(e=2, k=3), ValueError,
     r"topk = 3 \(expert_ids' columns\) out of range \[1, min\(16, experts = 2\)\]"),
    ("topk > 16", lambda a: moe_args(e=32, k=17), ValueError, r"topk = 17 .* out of range \[1, min\(16, experts = 32"),
    ("topk 0", lambda a: moe_args(k=0), ValueError, "topk = 0"),
]


@pytest.mark.parametrize("case", BAD, ids=[b[0] for b in BAD])
def test_moe_tp_rejects_bad_arguments_naming_them(ctx1, case):
    _, edit, exc, msg = case
    with pytest.raises(exc, match="tessera::moe_tp: " + msg):
        call("moe_tp", edit(moe_args()), ctx1)


@pytest.mark.parametrize("case", BAD, ids=[b[0] for b in BAD])
def test_moe_ep_rejects_bad_arguments_naming_them(ctx1, case):
    _, edit, exc, msg = case
    msg = msg.replace("inter_local", "inter")
    with pytest.raises(exc, match="tessera::moe_ep: " + msg):
        call("moe_ep", edit(moe_args()), ctx1)


def test_moe_ep_counts_experts_over_the_world():
    """moe_ep's weights hold E / world experts: the range checks see E."""
    c = ctx_at(4)
    try:
        with pytest.raises(ValueError, match=r"moe_ep: experts = 1028 out of range \[1, 1024\]"):
            call("moe_ep", moe_args(e_local=257), c)
        with pytest.raises(ValueError, match=r"moe_ep: topk = 9 .*experts = 8\)"):
            call("moe_ep", moe_args(e_local=2, k=9), c)
        assert call("moe_ep", moe_args(e_local=2, k=8), c).shape == (6, 16)  # E = 8: topk 8 fits
    finally:
        c.close()


@pytest.mark.parametrize("capacity", [-1, 2 ** 31])
def test_moe_ep_rejects_a_bad_capacity(ctx1, capacity):
    with pytest.raises(ValueError, match=f"tessera::moe_ep: capacity = {capacity}"):
        call("moe_ep", moe_args(), ctx1, capacity=capacity)


def test_device_is_checked_before_launch():
    """The real (CUDA) path checks every tensor's device against the context's; fake tensors skip it."""
    c = ctx_at(1, device="cuda:0")
    try:
        a = moe_args()
        with pytest.raises(ValueError, match=r"tessera::moe_tp: x is on meta, but the context's device is cuda:0"):
            _ops._moe_shapes("moe_tp", c, True, a["x"], a["expert_ids"], a["weights"], a["w_gate_up"], a["w_down"],
                             0, 1)
    finally:
        c.close()


def test_misaligned_weights_are_rejected_before_launch():
    """The real (CUDA) path passes raw pointers: a matrix at an odd storage offset is named, not launched."""
    a = moe_args(device="cpu")
    out = torch.empty_like(a["x"])
    _ops._moe_pointers("moe_tp", a["x"], a["expert_ids"], a["weights"], a["w_gate_up"], a["w_down"], out)
    base = torch.zeros(1 + a["w_down"].numel(), dtype=BF16)
    shifted = base[1:].view(a["w_down"].shape)
    with pytest.raises(ValueError, match=r"tessera::moe_ep: w_down is not 16-byte aligned \(storage offset 1\)"):
        _ops._moe_pointers("moe_ep", a["x"], a["expert_ids"], a["weights"], a["w_gate_up"], shifted, out)


def test_topk_rejects_bad_arguments_naming_them():
    lg = torch.empty(9, 8, device="meta")
    for logits, k, exc, msg in (
            (torch.empty(9, 8, dtype=torch.float64, device="meta"), 2, TypeError, "logits has dtype torch.float64"),
            (torch.empty(9, 8, 1, device="meta"), 2, ValueError, "logits must be 2-D"),
            (torch.empty(8, 9, device="meta").t(), 2, ValueError, "logits must be contiguous"),
            (lg, 0, ValueError, r"k = 0 out of range \[1, min\(16, experts = 8\)\]"),
            (lg, 9, ValueError, r"k = 9 out of range"),
            (torch.empty(9, 1025, device="meta"), 2, ValueError, r"experts = 1025 \(logits' columns\) out of range")):
        with pytest.raises(exc, match="tessera::moe_topk: " + msg):
            torch.ops.tessera.moe_topk(logits, k, True)


# ---- strategy codes -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["moe_tp", "moe_ep"])
def test_strategy_codes(ctx1, op):
    for name in ("automatic", "sequential", "pipelined"):
        assert call(op, moe_args(), ctx1, strategy=tt.STRATEGIES[name]).shape == (6, 16)
    for name in ("decomposition", "fused_ce", "fused_sm", "ring", "ulysses", "two_level"):
        with pytest.raises(ValueError, match=f"tessera::{op}: strategy {tt.STRATEGIES[name]}: automatic"):
            call(op, moe_args(), ctx1, strategy=tt.STRATEGIES[name])
    with pytest.raises(ValueError, match="strategy 'fused': one of"):
        ctx1.moe_tp(*moe_args().values(), strategy="fused")


def test_strategy_codes_match_the_library():
    """The codes the ops take are exactly those the library's strategy table gives moe_tp (op 4) and moe_ep
    (op 5)."""
    if tessera.library_error:
        pytest.skip(f"libtessera_c not loadable here: {tessera.library_error}")
    lib = tessera._lib.load()
    for op in (4, 5):
        taken = tuple(c for c in range(len(tt.STRATEGIES)) if lib.tessera_strategy_accepts(op, c))
        assert taken == _ops._MOE_STRATEGIES, (op, taken)


def test_library_rejects_a_null_session_and_bad_router_arguments():
    if tessera.library_error:
        pytest.skip(f"libtessera_c not loadable here: {tessera.library_error}")
    lib = tessera._lib.load()
    assert lib.tessera_moe_tp_check_status(None) == -1
    assert b"tessera_moe_tp_check_status: null session" in lib.tessera_last_error()
    assert lib.tessera_moe_ep_check_status(None) == -1
    assert lib.tessera_moe_topk_gating(None, 16, 32, 48, 4, 8, 9, 0, 2, 1) == -1
    assert b"k = 9 out of range" in lib.tessera_last_error()
    out = ctypes.c_int(-1)
    assert lib.tessera_moe_tp_resolve(None, 16, 16, 16, 16, 16, 16, 4, 16, 8, 4, 2, 0, ctypes.byref(out)) == -1
    assert b"null session" in lib.tessera_last_error() and out.value == -1


def test_shapes_only_context_has_no_status_to_check(ctx1):
    for check in (ctx1.moe_tp_check_status, ctx1.moe_ep_check_status):
        with pytest.raises(tessera.TesseraError, match="no library session"):
            check()
    a = moe_args(device="cpu")
    with pytest.raises(tessera.TesseraError, match="no library session"):
        ctx1.resolve_moe_tp(*a.values())
    with pytest.raises(ValueError, match="tessera::moe_tp: topk = 5"):
        ctx1.resolve_moe_tp(*moe_args(k=5, device="cpu").values())  # checked before the library


# ---- no backward ------------------------------------------------------------------------------------------------
def test_backward_through_the_ops_raises(ctx1):
    a = moe_args(device="cpu")
    a["x"] = torch.randn(6, 16, dtype=BF16, requires_grad=True)
    a["w_gate_up"] = torch.randn(4, 16, 16, dtype=BF16)
    a["w_down"] = torch.randn(4, 16, 8, dtype=BF16)
    a["weights"] = torch.full((6, 2), 0.5)
    y = call("moe_tp", a, ctx1)
    assert y.requires_grad  # autograd sees the op, and its backward refuses
    with pytest.raises(RuntimeError, match="backward through tessera.moe_tp.default but no autograd formula"):
        y.float().sum().backward()
    assert a["x"].grad is None
    with torch.no_grad():
        assert not call("moe_tp", a, ctx1).requires_grad


# ---- the layer ------------------------------------------------------------------------------------------------
def test_topk_reference_routes_like_the_router():
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0], [5.0, -1.0, 0.0, 1.0]])
    ids, w = _ops.moe_topk_reference(logits, 2)
    assert ids.tolist() == [[1, 3], [0, 3]]  # ties to the lower expert id, slots in descending weight
    assert torch.allclose(w.sum(-1), torch.ones(2))
    _, raw = _ops.moe_topk_reference(logits, 2, renormalize=False)
    assert torch.allclose(raw, torch.softmax(logits, -1).topk(2).values)


def test_layer_at_tp1_matches_a_plain_moe(ctx1):
    torch.manual_seed(7)
    h, inter, e, k, t = 32, 24, 6, 2, 40
    w_gate, w_up = torch.randn(e, inter, h) / 4, torch.randn(e, inter, h) / 4
    w_down, router = torch.randn(e, h, inter) / 4, torch.randn(e, h)
    layer = tt.TensorParallelMoE(h, inter, e, k, ctx1, device="cpu").load_full(w_gate, w_up, w_down, router)
    x = torch.randn(t, h).to(BF16)
    with torch.no_grad():
        y = layer(x)
    # the plain MoE, from the unfused weights
    p = torch.softmax(F.linear(x, layer.router).float(), -1)
    top, ids = p.topk(k, -1)
    top = top / top.sum(-1, keepdim=True)
    ref = torch.zeros(t, h)
    wg, wu, wd = (w.to(BF16).float() for w in (w_gate, w_up, w_down))
    for tok in range(t):
        for s in range(k):
            ex = ids[tok, s]
            xf = x[tok].float()
            ref[tok] += top[tok, s] * (wd[ex] @ (F.silu(wg[ex] @ xf) * (wu[ex] @ xf)))
    assert y.shape == (t, h) and y.dtype == BF16
    assert ((y.float() - ref).norm() / ref.norm()).item() < 2e-2
    # explicit routing: an expert with no tokens and every token on one expert
    ids2 = torch.zeros(t, k, dtype=torch.int32)
    ids2[:, 1] = 3
    w2 = torch.full((t, k), 0.5)
    with torch.no_grad():
        y2 = layer(x, ids2, w2)
    assert torch.allclose(y2.float(), moe_reference(x, ids2, w2, layer.w_gate_up, layer.w_down), rtol=2e-2, atol=2e-2)
    with pytest.raises(RuntimeError, match="no autograd formula"):
        layer(x).float().sum().backward()
    with pytest.raises(ValueError, match="pass both expert_ids and weights"):
        layer(x, ids2)


def test_layer_at_world2_on_meta():
    c = ctx_at(2, rank=1, device="meta")
    try:
        layer = tt.TensorParallelMoE(64, 256, 8, 2, c, dtype=BF16)
        assert tuple(layer.w_gate_up.shape) == (8, 256, 64)  # 2 · (256 / 2) rows per expert
        assert tuple(layer.w_down.shape) == (8, 64, 128)
        assert tuple(layer.router.shape) == (8, 64)
        y = layer(torch.empty(10, 64, dtype=BF16, device="meta"))
        assert y.shape == (10, 64)
        norouter = tt.TensorParallelMoE(64, 256, 8, 2, c, router=False)
        with pytest.raises(ValueError, match="router=False"):
            norouter(torch.empty(10, 64, dtype=BF16, device="meta"))
        with pytest.raises(ValueError, match="intermediate = 255 is not divisible"):
            tt.TensorParallelMoE(64, 255, 8, 2, c)
        with pytest.raises(ValueError, match="topk = 9 out of range"):
            tt.TensorParallelMoE(64, 256, 8, 9, c)
        with pytest.raises(ValueError, match="strategy 'fused_ce': automatic, sequential or pipelined"):
            tt.TensorParallelMoE(64, 256, 8, 2, c, strategy="fused_ce")
    finally:
        c.close()


def test_fuse_gate_up_experts_interleaves_per_expert():
    g = torch.arange(2 * 3 * 4).reshape(2, 3, 4).float()
    u = -g
    f = tt.fuse_gate_up_experts(g, u)
    assert f.shape == (2, 6, 4)
    for e in range(2):
        assert torch.equal(f[e], tt.fuse_gate_up(g[e], u[e]))
        assert torch.equal(f[e, 0::2], g[e]) and torch.equal(f[e, 1::2], u[e])


def test_compiled_layer_has_no_graph_break(ctx1):
    layer = tt.TensorParallelMoE(32, 16, 4, 2, ctx1, device="cpu")
    x = torch.randn(8, 32).to(BF16)
    with torch.no_grad():
        eager = layer(x)
        compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")(x)
    assert torch.equal(eager, compiled)


def test_opcheck_schema_and_fake(ctx1):
    a = moe_args(device="cpu")
    g = torch.Generator().manual_seed(0)
    a["x"] = torch.randn(6, 16, generator=g).to(BF16)
    a["w_gate_up"], a["w_down"] = torch.randn(4, 16, 16, generator=g).to(BF16), torch.randn(4, 16, 8).to(BF16)
    a["expert_ids"] = torch.randint(0, 4, (6, 2), generator=g, dtype=torch.int32)
    a["weights"] = torch.rand(6, 2, generator=g)
    utils = ("test_schema", "test_faketensor")
    args = (a["x"], a["expert_ids"], a["weights"], a["w_gate_up"], a["w_down"], ctx1.handle)
    torch.library.opcheck(torch.ops.tessera.moe_tp.default, args + (7,), test_utils=utils)
    torch.library.opcheck(torch.ops.tessera.moe_topk.default, (torch.randn(6, 4, generator=g), 2, False),
                          test_utils=utils)
