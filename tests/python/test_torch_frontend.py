"""CPU tests of the tessera package and its torch front end (no GPU).

* The package imports, reports its version, and checks NCCL when the library loads.
* The tessera:: ops' fake (meta) implementations give the right shapes at world sizes 1..4 and reject bad
  arguments with errors naming them.
* The autograd modules at TP = 1 against nn.Linear (outputs and every gradient), through CPU reference kernels
  registered here for one-rank contexts (the library's kernels are CUDA only), eager and under
  torch.compile(fullgraph=True): the same numbers and no graph break.
* At world size 2 on the meta device: forward and backward shapes of every module.
"""
import math
import os
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the torch front-end tests need it")

import tessera  # noqa: E402
import tessera.torch as tt  # noqa: E402
from tessera.torch import _context, _ops  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---- CPU reference kernels for one-rank contexts (test only) ---------------------------------------------------
def _one_rank(handle):
    c = _context.lookup(handle)
    assert c.world == 1, "the CPU reference kernels model a one-rank group only"


def _ref_mm(a, b, b_kn=False):
    """a @ b.T, or a @ b with b_kn (b [K, N])."""
    return (a.float() @ (b.float() if b_kn else b.float().t())).to(a.dtype)


def _ref_ag(a, b, ctx, m, swiglu=False, strategy=0, b_kn=False):
    _one_rank(ctx)
    assert not (swiglu and b_kn)
    gu = _ref_mm(a, b, b_kn)
    if swiglu:
        g, u = gu[:, 0::2].float(), gu[:, 1::2].float()
        gu = (torch.nn.functional.silu(g) * u).to(a.dtype)
    return gu


torch.library.register_kernel("tessera::ag_gemm", "cpu", _ref_ag)
torch.library.register_kernel(
    "tessera::ag_gemm_gathered", "cpu",
    lambda a, b, ctx, m, swiglu=False, strategy=0, b_kn=False: (_ref_ag(a, b, ctx, m, swiglu, b_kn=b_kn), a.clone()))
torch.library.register_kernel("tessera::gemm_rs", "cpu",
                              lambda a, b, ctx, strategy=0, b_kn=False: (_one_rank(ctx), _ref_mm(a, b, b_kn))[1])
torch.library.register_kernel("tessera::gemm_ar", "cpu", lambda a, b, ctx, strategy=0: (_one_rank(ctx), _ref_mm(a, b))[1])
torch.library.register_kernel(
    "tessera::mlp", "cpu",
    lambda x, wgu, wd, ctx, m, s1=0, s2=0: _ref_mm(_ref_ag(x, wgu, ctx, m, True), wd))


@pytest.fixture
def ctx1():
    c = tt.Context._for_shapes(rank=0, world=1)
    yield c
    c.close()


def rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


# ---- package ----------------------------------------------------------------------------------------------------
def test_version_is_the_version_file():
    with open(os.path.join(ROOT, "VERSION")) as f:
        assert tessera.__version__ == f.read().strip()


def test_library_loads_and_nccl_is_checked():
    if tessera.library_error:
        pytest.skip(f"libtessera_c not loadable here: {tessera.library_error}")
    built, loaded = tessera._lib.nccl_versions()
    assert built.count(".") == 2 and loaded.count(".") == 2
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert tessera._lib.check_nccl(strict=False) == (built, loaded)
    if built != loaded:  # the warning names both
        assert any(built in str(x.message) and loaded in str(x.message) for x in w)
        with pytest.raises(tessera.TesseraError, match=f"built with NCCL {built}.*loaded NCCL {loaded}"):
            tessera._lib.check_nccl(strict=True)
    else:
        assert not w


def test_env_report_runs():
    if tessera.library_error:
        pytest.skip(f"libtessera_c not loadable here: {tessera.library_error}")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(tessera.__file__))))
    r = subprocess.run([sys.executable, "-m", "tessera.env", "--no-probe"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "NCCL: built with" in r.stdout and "CUDA devices:" in r.stdout


def test_context_without_gpu_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(tessera.TesseraError, match="CUDA device"):
        tt.Context()


def test_closed_context_handle_is_rejected(ctx1):
    h = ctx1.handle
    ctx1.close()
    with pytest.raises(tessera.TesseraError, match=f"handle {h} is closed"):
        torch.ops.tessera.gemm_ar(torch.empty(4, 8, dtype=torch.bfloat16, device="meta"),
                                  torch.empty(4, 8, dtype=torch.bfloat16, device="meta"), h, 0)


def test_dropping_an_open_context_runs_nothing_collective():
    """__del__ never calls into the library (destroy is collective): it warns and leaks."""
    calls = []

    class Lib:
        def __getattr__(self, name):
            return lambda *a: calls.append(name)

    c = tt.Context._for_shapes(rank=0, world=2)
    c._h, c._lib = 0x1234, Lib()  # as if a session were open
    with pytest.warns(ResourceWarning, match="was not closed"):
        c.__del__()
    assert calls == []
    c.close()  # explicit close does reach the library
    assert calls == ["tessera_session_destroy"]


def test_several_contexts_get_distinct_handles():
    cs = [tt.Context._for_shapes(rank=r % 2, world=2) for r in range(3)]
    assert len({c.handle for c in cs}) == 3
    for c in cs:
        c.close()
    assert all(c.closed for c in cs)


# ---- fake implementations: shapes and bad input ----------------------------------------------------------------
def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_fake_shapes(world):
    m, k, n, h, i = 1000, 64, 96, 128, 256
    for rank in range(world):
        c = tt.Context._for_shapes(rank=rank, world=world)
        ml = tt.shard_rows(m, world, rank)
        assert torch.ops.tessera.ag_gemm(meta(ml, k), meta(n, k), c.handle, m).shape == (m, n)
        assert torch.ops.tessera.ag_gemm(meta(ml, k), meta(n, k), c.handle, m, True).shape == (m, n // 2)
        out, g = torch.ops.tessera.ag_gemm_gathered(meta(ml, k), meta(n, k), c.handle, m)
        assert out.shape == (m, n) and g.shape == (m, k)
        out, g = torch.ops.tessera.ag_gemm_gathered(meta(ml, k), meta(k, n), c.handle, m, False, 0, True)  # b_kn
        assert out.shape == (m, n) and g.shape == (m, k)
        assert torch.ops.tessera.gemm_rs(meta(m, k), meta(n, k), c.handle).shape == (ml, n)
        assert torch.ops.tessera.gemm_rs(meta(m, k), meta(k, n), c.handle, 0, True).shape == (ml, n)  # b_kn
        assert torch.ops.tessera.gemm_ar(meta(m, k), meta(n, k), c.handle).shape == (m, n)
        assert torch.ops.tessera.mlp(meta(ml, h), meta(2 * i, h), meta(h, i), c.handle, m).shape == (ml, h)
        c.close()
    # ragged: the shards add up to m
    assert sum(tt.shard_rows(m, world, r) for r in range(world)) == m


def test_bad_input_is_rejected_naming_the_argument():
    c = tt.Context._for_shapes(rank=1, world=2)
    op = torch.ops.tessera
    with pytest.raises(TypeError, match="b has dtype torch.float16 but a has torch.bfloat16"):
        op.ag_gemm(meta(64, 32), meta(16, 32, dtype=torch.float16), c.handle, 128)
    with pytest.raises(TypeError, match="a has dtype torch.float32; bf16 or fp16 only"):
        op.gemm_rs(meta(64, 32, dtype=torch.float32), meta(16, 32), c.handle)
    with pytest.raises(ValueError, match="a must be contiguous"):
        op.gemm_ar(meta(32, 64).t(), meta(16, 64), c.handle)
    with pytest.raises(ValueError, match="a has K = 32 but b has K = 48"):
        op.ag_gemm(meta(64, 32), meta(16, 48), c.handle, 128)
    with pytest.raises(ValueError, match="a has 60 rows but rank 1's shard of m = 128 over 2 ranks has 64"):
        op.ag_gemm(meta(60, 32), meta(16, 32), c.handle, 128)
    with pytest.raises(ValueError, match="swiglu needs an even N"):
        op.ag_gemm(meta(64, 32), meta(15, 32), c.handle, 128, True)
    with pytest.raises(ValueError, match="w_gate_up is"):
        op.mlp(meta(64, 32), meta(48, 32), meta(32, 16), c.handle, 128)
    with pytest.raises(ValueError, match="x must be 2-D"):
        op.mlp(meta(64, 32, 1), meta(32, 32), meta(32, 16), c.handle, 128)
    # b_kn: b is [K, N]
    with pytest.raises(ValueError, match=r"gemm_rs: a has K = 32 but b \(b_kn: \[K, N\]\) has K = 16 rows"):
        op.gemm_rs(meta(128, 32), meta(16, 32), c.handle, 0, True)
    with pytest.raises(ValueError, match="ag_gemm_gathered: b_kn needs N a multiple of 8.*N = 12"):
        op.ag_gemm_gathered(meta(64, 32), meta(32, 12), c.handle, 128, False, 0, True)
    with pytest.raises(ValueError, match="gemm_rs: b_kn needs N a multiple of 8.*N = 20"):
        op.gemm_rs(meta(128, 32), meta(32, 20), c.handle, 0, True)
    with pytest.raises(ValueError, match="ag_gemm_gathered: swiglu needs b as \\[N, K\\].*b_kn"):
        op.ag_gemm_gathered(meta(64, 32), meta(32, 16), c.handle, 128, True, 0, True)
    c.close()


def test_modules_reject_indivisible_sizes():
    c = tt.Context._for_shapes(rank=0, world=2, device="meta")
    with pytest.raises(ValueError, match="out_features = 15 is not divisible by the group's world size 2"):
        tt.ColumnParallelLinear(8, 15, c)
    with pytest.raises(ValueError, match="in_features = 7"):
        tt.RowParallelLinear(7, 8, c)
    with pytest.raises(ValueError, match="strategy 'fast'"):
        tt.RowParallelLinear(8, 8, c, strategy="fast")
    c.close()


def test_opcheck_schema_and_fake():
    c = tt.Context._for_shapes(rank=0, world=1)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 32, generator=g).bfloat16(), torch.randn(48, 32, generator=g).bfloat16()
    utils = ("test_schema", "test_faketensor")
    torch.library.opcheck(torch.ops.tessera.ag_gemm.default, (a, b, c.handle, 64, False, 0), test_utils=utils)
    torch.library.opcheck(torch.ops.tessera.ag_gemm_gathered.default, (a, b, c.handle, 64, True, 0), test_utils=utils)
    torch.library.opcheck(torch.ops.tessera.gemm_rs.default, (a, b, c.handle, 0), test_utils=utils)
    bkn = torch.randn(32, 48, generator=g).bfloat16()
    torch.library.opcheck(torch.ops.tessera.ag_gemm_gathered.default, (a, bkn, c.handle, 64, False, 0, True),
                          test_utils=utils)
    torch.library.opcheck(torch.ops.tessera.gemm_rs.default, (a, bkn, c.handle, 0, True), test_utils=utils)
    torch.library.opcheck(torch.ops.tessera.gemm_ar.default, (a, b, c.handle, 0), test_utils=utils)
    torch.library.opcheck(torch.ops.tessera.mlp.default,
                          (a, torch.randn(64, 32, generator=g).bfloat16(), torch.randn(32, 32, generator=g).bfloat16(),
                           c.handle, 64, 0, 0), test_utils=utils)
    c.close()


# ---- modules at TP = 1 against nn.Linear -----------------------------------------------------------------------
class TesseraBlock(torch.nn.Module):
    """Column -> GELU -> Row, then the gated MLP: every module and op once."""

    def __init__(self, ctx, h, f, bias):
        super().__init__()
        self.fc1 = tt.ColumnParallelLinear(h, f, ctx, bias=bias, device="cpu")
        self.fc2 = tt.RowParallelLinear(f, h, ctx, bias=bias, device="cpu")
        self.mlp = tt.TensorParallelMLP(h, f, ctx, device="cpu")

    def forward(self, x):
        y = self.fc2(torch.nn.functional.gelu(self.fc1(x)))
        return self.mlp(y)


class ReferenceBlock(torch.nn.Module):
    def __init__(self, h, f, bias):
        super().__init__()
        kw = dict(dtype=torch.bfloat16)
        self.fc1, self.fc2 = torch.nn.Linear(h, f, bias=bias, **kw), torch.nn.Linear(f, h, bias=bias, **kw)
        self.gate = torch.nn.Linear(h, f, bias=False, **kw)
        self.up = torch.nn.Linear(h, f, bias=False, **kw)
        self.down = torch.nn.Linear(f, h, bias=False, **kw)

    def forward(self, x):
        y = self.fc2(torch.nn.functional.gelu(self.fc1(x)))
        return self.down(torch.nn.functional.silu(self.gate(y)) * self.up(y))


def build(ctx, bias, h=64, f=128):
    torch.manual_seed(0)
    ref = ReferenceBlock(h, f, bias)
    tes = TesseraBlock(ctx, h, f, bias)
    tes.fc1.load_full(ref.fc1.weight, ref.fc1.bias)
    tes.fc2.load_full(ref.fc2.weight, ref.fc2.bias)
    tes.mlp.load_full(ref.gate.weight, ref.up.weight, ref.down.weight)
    return ref, tes


def grads(ref, tes):
    pairs = [("fc1.weight", tes.fc1.weight.grad, ref.fc1.weight.grad),
             ("fc2.weight", tes.fc2.weight.grad, ref.fc2.weight.grad),
             ("mlp.w_down", tes.mlp.w_down.grad, ref.down.weight.grad),
             ("mlp.w_gate_up", tes.mlp.w_gate_up.grad, tt.fuse_gate_up(ref.gate.weight.grad, ref.up.weight.grad))]
    if ref.fc1.bias is not None:
        pairs += [("fc1.bias", tes.fc1.bias.grad, ref.fc1.bias.grad), ("fc2.bias", tes.fc2.bias.grad, ref.fc2.bias.grad)]
    return pairs


def run_step(model, x, dy):
    x = x.clone().requires_grad_(True)
    y = model(x)
    y.backward(dy)
    return y, x.grad


def test_elementwise_ops_run_on_cpu():
    """transpose, swiglu and swiglu_backward take CPU tensors (the reference math): fresh outputs, never views of
    the input (custom ops may not alias), schema and fake checked by opcheck."""
    torch.manual_seed(4)
    for shape in [(5, 1), (1, 5), (3, 4), (0, 2)]:
        w = torch.randn(shape).bfloat16()
        t = torch.ops.tessera.transpose(w)
        assert t.shape == (shape[1], shape[0]) and t.is_contiguous() and torch.equal(t, w.t())
        assert w.numel() == 0 or t.data_ptr() != w.data_ptr()
        torch.library.opcheck(torch.ops.tessera.transpose.default, (w,))
    gu, dh = torch.randn(6, 8).bfloat16(), torch.randn(6, 4).bfloat16()
    assert torch.equal(torch.ops.tessera.swiglu(gu), _ops.swiglu_reference(gu))
    dgu, h = torch.ops.tessera.swiglu_backward(gu, dh)
    ref_dgu, ref_h = _ops.swiglu_backward_reference(gu, dh)
    assert torch.equal(dgu, ref_dgu) and torch.equal(h, ref_h)
    torch.library.opcheck(torch.ops.tessera.swiglu.default, (gu,))
    torch.library.opcheck(torch.ops.tessera.swiglu_backward.default, (gu, dh))


@pytest.mark.parametrize("bias,backend", [(False, None), (True, None), (False, "aot_eager"), (True, "aot_eager"),
                                          (True, "inductor")])
def test_modules_match_nn_linear_at_tp1(ctx1, bias, backend):
    ref, tes = build(ctx1, bias)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(96, 64, generator=g).bfloat16()
    dy = torch.randn(96, 64, generator=g).bfloat16()
    model = torch.compile(tes, fullgraph=True, backend=backend) if backend else tes
    y, dx = run_step(model, x, dy)
    y_ref, dx_ref = run_step(ref, x, dy)
    assert y.shape == y_ref.shape and y.dtype == torch.bfloat16
    assert rel_err(y, y_ref) < 2e-2, "output"
    assert rel_err(dx, dx_ref) < 2e-2, "input gradient"
    for name, a, b in grads(ref, tes):
        assert a is not None, name
        assert rel_err(a, b) < 2e-2, name


def test_compile_dynamic_token_count_one_graph(ctx1):
    """dynamic=True: the ops' fake implementations take a symbolic token count, so several M share one graph."""
    ref, tes = build(ctx1, True)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = torch.compile(tes, fullgraph=True, backend="aot_eager", dynamic=True)
    for n in (96, 128, 200):
        x, dy = torch.randn(n, 64).bfloat16(), torch.randn(n, 64).bfloat16()
        for p in list(tes.parameters()) + list(ref.parameters()):
            p.grad = None
        y, dx = run_step(model, x, dy)
        y_ref, dx_ref = run_step(ref, x, dy)
        assert rel_err(y, y_ref) < 2e-2 and rel_err(dx, dx_ref) < 2e-2
        for name, a, b in grads(ref, tes):
            assert rel_err(a, b) < 2e-2, (n, name)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def test_compile_has_no_graph_break(ctx1):
    _, tes = build(ctx1, True)
    x = torch.randn(32, 64).bfloat16()
    ex = torch._dynamo.explain(tes)(x)
    assert ex.graph_break_count == 0, ex.break_reasons
    assert ex.graph_count == 1


def test_mlp_without_autograd_uses_the_fused_op(ctx1):
    ref, tes = build(ctx1, False)
    x = torch.randn(40, 64).bfloat16()
    with torch.no_grad():
        y = tes.mlp(x)
        y_ref = ref.down(torch.nn.functional.silu(ref.gate(x)) * ref.up(x))
    assert rel_err(y, y_ref) < 2e-2


def test_main_grad_accumulation(ctx1):
    torch.manual_seed(0)
    ref = torch.nn.Linear(64, 32, bias=False, dtype=torch.bfloat16)
    col = tt.ColumnParallelLinear(64, 32, ctx1, bias=False, device="cpu", accumulate_into_main_grad=True)
    col.load_full(ref.weight)
    col.weight.main_grad = torch.full((32, 64), 0.5, dtype=torch.float32)
    x = torch.randn(16, 64).bfloat16()
    for _ in range(2):
        col(x).sum().backward()
    ref(x).sum().backward()
    assert col.weight.grad is None  # no grad_added_to_main_grad attribute: None, the sum went to main_grad
    assert rel_err(col.weight.main_grad - 0.5, 2 * ref.weight.grad.float()) < 2e-2
    # With Megatron's flag the autograd gradient is a dummy and the flag is set.
    col.weight.grad_added_to_main_grad = False
    col(x).sum().backward()
    assert col.weight.grad_added_to_main_grad is True
    assert rel_err(col.weight.main_grad - 0.5, 3 * ref.weight.grad.float()) < 2e-2


# ---- world size 2 on the meta device: shapes through forward and backward ------------------------------------
@pytest.mark.parametrize("rank", [0, 1])
def test_modules_shapes_at_world2(rank):
    c = tt.Context._for_shapes(rank=rank, world=2, device="meta")
    m, h, f = 130, 64, 128  # ragged: shards of 65
    ml = tt.shard_rows(m, 2, rank)
    col = tt.ColumnParallelLinear(h, f, c, device="meta")
    row = tt.RowParallelLinear(f, h, c, device="meta")
    mlp = tt.TensorParallelMLP(h, f, c, device="meta")
    x = torch.empty(ml, h, dtype=torch.bfloat16, device="meta", requires_grad=True)
    y1 = col(x, m=m)
    assert y1.shape == (m, f // 2)
    y2 = row(y1)
    assert y2.shape == (ml, h)
    y3 = mlp(y2, m=m)
    assert y3.shape == (ml, h)
    y3.sum().backward()
    assert x.grad.shape == x.shape
    assert col.weight.grad.shape == col.weight.shape and col.bias.grad.shape == col.bias.shape
    assert row.weight.grad.shape == row.weight.shape and row.bias.grad.shape == (h,)
    assert mlp.w_gate_up.grad.shape == (f, h) and mlp.w_down.grad.shape == (h, f // 2)
    c.close()


def test_legacy_module_still_imports():
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import tessera_torch  # noqa: F401
    assert hasattr(tessera_torch, "Session")


# ---- the decoder layer ---------------------------------------------------------------------------------------------
class PlainDecoderLayer(torch.nn.Module):
    """The same Llama-style layer in plain PyTorch (nn.Linear), the reference."""

    def __init__(self, h, inter, heads, kv):
        super().__init__()
        from tessera.torch.layers import attention, rms_norm, rope
        self.f = (attention, rms_norm, rope)
        d, kw = h // heads, dict(bias=False, dtype=torch.bfloat16)
        self.heads, self.kv, self.d = heads, kv, d
        self.q, self.k = torch.nn.Linear(h, heads * d, **kw), torch.nn.Linear(h, kv * d, **kw)
        self.v, self.o = torch.nn.Linear(h, kv * d, **kw), torch.nn.Linear(heads * d, h, **kw)
        self.gate, self.up = torch.nn.Linear(h, inter, **kw), torch.nn.Linear(h, inter, **kw)
        self.down = torch.nn.Linear(inter, h, **kw)
        self.ln1 = torch.nn.Parameter(1 + 0.1 * torch.randn(h).bfloat16())
        self.ln2 = torch.nn.Parameter(1 + 0.1 * torch.randn(h).bfloat16())

    def forward(self, x):
        attention, rms_norm, rope = self.f
        m = x.shape[0]
        hn = rms_norm(x, self.ln1, 1e-5)
        q = self.q(hn).reshape(m, self.heads, self.d).transpose(0, 1)
        k = self.k(hn).reshape(m, self.kv, self.d).transpose(0, 1)
        v = self.v(hn).reshape(m, self.kv, self.d).transpose(0, 1)
        x = x + self.o(attention(rope(q), rope(k), v).transpose(0, 1).reshape(m, -1))
        hn = rms_norm(x, self.ln2, 1e-5)
        return x + self.down(torch.nn.functional.silu(self.gate(hn)) * self.up(hn))


@pytest.mark.parametrize("backend", [None, "aot_eager"])
def test_decoder_layer_matches_plain_pytorch_at_tp1(ctx1, backend):
    torch.manual_seed(0)
    h, inter, heads, kv = 64, 128, 8, 2
    ref = PlainDecoderLayer(h, inter, heads, kv)
    tes = tt.TensorParallelDecoderLayer(h, inter, heads, kv, ctx1, device="cpu")
    tes.load_full(ref.q.weight, ref.k.weight, ref.v.weight, ref.o.weight, ref.gate.weight, ref.up.weight,
                  ref.down.weight, ref.ln1, ref.ln2)
    x = torch.randn(80, h).bfloat16()
    model = torch.compile(tes, fullgraph=True, backend=backend) if backend else tes
    xt, xr = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    loss_t = model(xt).float().square().mean()
    loss_r = ref(xr).float().square().mean()
    loss_t.backward()
    loss_r.backward()
    assert abs(loss_t.item() - loss_r.item()) <= 2e-2 * abs(loss_r.item())
    assert rel_err(xt.grad, xr.grad) < 2e-2
    d = h // heads
    pairs = {"qkv": (tes.qkv.weight.grad, torch.cat((ref.q.weight.grad, ref.k.weight.grad, ref.v.weight.grad))),
             "o": (tes.o.weight.grad, ref.o.weight.grad), "down": (tes.mlp.w_down.grad, ref.down.weight.grad),
             "gate_up": (tes.mlp.w_gate_up.grad, tt.fuse_gate_up(ref.gate.weight.grad, ref.up.weight.grad)),
             "ln1": (tes.ln1.grad, ref.ln1.grad), "ln2": (tes.ln2.grad, ref.ln2.grad)}
    assert d * heads == h
    for name, (a, b) in pairs.items():
        assert rel_err(a, b) < 2e-2, name


@pytest.mark.parametrize("rank", [0, 1])
def test_decoder_layer_shapes_at_world2(rank):
    c = tt.Context._for_shapes(rank=rank, world=2, device="meta")
    layer = tt.TensorParallelDecoderLayer(64, 128, 8, 2, c, device="meta")
    assert layer.qkv.weight.shape == ((4 + 2 * 1) * 8, 64)
    x = torch.empty(tt.shard_rows(130, 2, rank), 64, dtype=torch.bfloat16, device="meta", requires_grad=True)
    y = layer(x, m=130)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape and layer.qkv.weight.grad.shape == layer.qkv.weight.shape
    with pytest.raises(ValueError, match="kv_heads = 1 is not divisible by the group's world size 2"):
        tt.TensorParallelDecoderLayer(64, 128, 8, 1, c, device="meta")
    c.close()


# ---- tuning ahead of the step ----------------------------------------------------------------------------------
def test_tuning_shapes_of_a_decoder_layer():
    c = tt.Context._for_shapes(rank=0, world=2, device="meta")
    layer = tt.TensorParallelDecoderLayer(64, 128, 8, 2, c, device="meta")
    s = tt.tuning_shapes(layer, 1024)
    qkv_n = (4 + 2 * 1) * 8
    # The dX GEMMs take the weight as B [K, N] (b_kn: the trailing True).
    assert s == [("ag_gemm", 1024, qkv_n, 64), ("gemm_rs", 1024, 64, qkv_n, True),           # QKV forward / dX
                 ("gemm_rs", 1024, 64, 32), ("ag_gemm", 1024, 32, 64, False, True),         # O forward / dX
                 ("ag_gemm", 1024, 128, 64), ("gemm_rs", 1024, 64, 128, True),              # gate/up forward / dX
                 ("gemm_rs", 1024, 64, 64), ("ag_gemm", 1024, 64, 64, False, True)]         # down forward / dX
    assert tt.tuning_shapes(layer.mlp, 1024, training=False) == [("ag_gemm", 1024, 128, 64, True),
                                                                 ("gemm_rs", 1024, 64, 64)]
    fixed = tt.ColumnParallelLinear(64, 128, c, device="meta", strategy="sequential")
    assert tt.tuning_shapes(fixed, 1024) == []
    c.close()


def test_pretune_resolves_each_shape_with_this_ranks_shard(monkeypatch):
    calls = []

    class Lib:
        def tessera_resolve(self, h, op, m, ml, n, k, dt, swiglu, a, b, d, out):
            calls.append((op, m, ml, n, k, dt, swiglu))
            out._obj.value = tt.STRATEGIES["fused_ce"] if op == 0 else tt.STRATEGIES["sequential"]
            return 0

    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: type("S", (), {"synchronize": lambda self: None})())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    c = tt.Context._for_shapes(rank=1, world=2)  # buffers on the CPU here
    c._h, c._lib = 0x1, Lib()
    got = c.pretune([("ag_gemm", 1000, 256, 64), ("gemm_rs", 1000, 64, 128), ("ag_gemm", 1000, 256, 64, True),
                     ("gemm_rs", 1000, 64, 128, True), ("ag_gemm", 1000, 256, 64, False, True)])
    assert got == {("ag_gemm", 1000, 256, 64): "fused_ce", ("gemm_rs", 1000, 64, 128): "sequential",
                   ("ag_gemm", 1000, 256, 64, True): "fused_ce", ("gemm_rs", 1000, 64, 128, True): "sequential",
                   ("ag_gemm", 1000, 256, 64, False, True): "fused_ce"}
    # flags: 1 swiglu, 2 B as [K, N]
    assert calls == [(0, 1000, 500, 256, 64, 0, 0), (1, 1000, 500, 64, 128, 0, 0), (0, 1000, 500, 256, 64, 0, 1),
                     (1, 1000, 500, 64, 128, 0, 2), (0, 1000, 500, 256, 64, 0, 2)]
    with pytest.raises(ValueError, match="pretune: shape"):
        c.pretune([("gemm_rs", 10, 16, 16, True, True)])
    with pytest.raises(ValueError, match="pretune: op 'mlp'"):
        c.pretune([("mlp", 10, 10, 10)])
    c._h = None
    c.close()


# ---- sp_attention: fake shapes, bad input, the CPU reference at one rank ---------------------------------------
def _ref_attention(q, k, v, causal, scale):
    """float32 attention of q [B, L, Hq, D] against k, v [B, S, Hkv, D] (GQA by repetition); causal: row i sees
    keys <= i (L == S). Returns (o in q's dtype, lse [B, Hq, L] float32)."""
    g = q.shape[2] // k.shape[2]
    qf = q.float().transpose(1, 2)
    kf = k.float().repeat_interleave(g, dim=2).transpose(1, 2)
    vf = v.float().repeat_interleave(g, dim=2).transpose(1, 2)
    s = (qf @ kf.transpose(-1, -2)) * (scale or 1.0 / math.sqrt(q.shape[3]))
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    o = (torch.softmax(s, dim=-1) @ vf).transpose(1, 2).to(q.dtype)
    return o, lse


def _ref_sp(q, k, v, ctx, causal=True, softmax_scale=0.0, strategy=0):
    _one_rank(ctx)  # at one rank the zig-zag shard is the whole sequence, in order
    return _ref_attention(q, k, v, causal, softmax_scale)


def _ref_sp_o(q, k, v, ctx, causal=True, softmax_scale=0.0, strategy=0):
    return _ref_sp(q, k, v, ctx, causal, softmax_scale, strategy)[0]


torch.library.register_kernel("tessera::sp_attention", "cpu", _ref_sp_o)
torch.library.register_kernel("tessera::sp_attention_lse", "cpu", _ref_sp)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_sp_attention_fake_shapes(world):
    b, c, hq, hkv, d = 2, 48, 8, 2, 128
    for rank in range(world):
        ctx = tt.Context._for_shapes(rank=rank, world=world)
        q, kv = meta(b, 2 * c, hq, d), meta(b, 2 * c, hkv, d)
        o = torch.ops.tessera.sp_attention(q, kv, kv, ctx.handle, True, 0.0, 0)
        assert o.shape == (b, 2 * c, hq, d) and o.dtype == torch.bfloat16
        o, lse = torch.ops.tessera.sp_attention_lse(q, kv, kv, ctx.handle, False, 0.0, 3)
        assert o.shape == (b, 2 * c, hq, d) and lse.shape == (b, hq, 2 * c) and lse.dtype == torch.float32
        o, lse = tt.sp_attention(q, kv, kv, ctx, causal=False, strategy="sequential", return_lse=True)
        assert lse.shape == (b, hq, 2 * c)
        ctx.close()


def test_sp_attention_rejects_bad_input_naming_the_argument():
    c = tt.Context._for_shapes(rank=1, world=2)
    op = torch.ops.tessera.sp_attention
    q, kv = meta(1, 64, 8, 128), meta(1, 64, 2, 128)
    with pytest.raises(ValueError, match="q must be 4-D"):
        op(meta(64, 8, 128), kv, kv, c.handle)
    with pytest.raises(TypeError, match="k has dtype torch.float16 but q has torch.bfloat16"):
        op(q, meta(1, 64, 2, 128, dtype=torch.float16), kv, c.handle)
    with pytest.raises(ValueError, match="k is .* but v is"):
        op(q, kv, meta(1, 64, 4, 128), c.handle)
    with pytest.raises(ValueError, match="k has batch 1 and 32 rows but q has batch 1 and 64 rows"):
        op(q, meta(1, 32, 2, 128), meta(1, 32, 2, 128), c.handle)
    with pytest.raises(ValueError, match="head_dim = 96"):
        op(meta(1, 64, 8, 96), meta(1, 64, 2, 96), meta(1, 64, 2, 96), c.handle)
    with pytest.raises(ValueError, match="heads_q = 6 is not a multiple of heads_kv = 4"):
        op(meta(1, 64, 6, 128), meta(1, 64, 4, 128), meta(1, 64, 4, 128), c.handle)
    with pytest.raises(ValueError, match="q has 63 rows"):
        op(meta(1, 63, 8, 128), meta(1, 63, 2, 128), meta(1, 63, 2, 128), c.handle)
    with pytest.raises(ValueError, match="softmax_scale = -1.0"):
        op(q, kv, kv, c.handle, True, -1.0)
    with pytest.raises(ValueError, match="strategy 2: automatic"):
        op(q, kv, kv, c.handle, True, 0.0, 2)
    with pytest.raises(ValueError, match="strategy 'fast'"):
        tt.sp_attention(q, kv, kv, c, strategy="fast")
    with pytest.raises(ValueError, match="q must be contiguous"):
        op(meta(1, 8, 64, 128).transpose(1, 2), kv, kv, c.handle)
    c.close()


def test_sp_attention_checks_device_and_alignment_before_launch():
    """The real (CUDA) path checks every tensor's device against the context's and that q, k, v are 16-byte
    aligned (a contiguous view at an odd storage offset is not); fake tensors skip both."""
    c = tt.Context._for_shapes(rank=0, world=1, device="cuda:0")
    try:
        q, kv = meta(1, 64, 8, 128), meta(1, 64, 2, 128)
        with pytest.raises(ValueError, match=r"tessera::sp_attention: q is on meta, but the context's device is "
                                             r"cuda:0"):
            _ops._check_tensors("sp_attention", c, True, ndim=4, q=q, k=kv, v=kv)
    finally:
        c.close()
    base = torch.zeros(1 + 64 * 8 * 128, dtype=torch.bfloat16)
    shifted = base[1:].view(1, 64, 8, 128)  # contiguous, 2 bytes past an aligned start
    assert shifted.is_contiguous()
    aligned = torch.zeros(1, 64, 8, 128, dtype=torch.bfloat16)
    _ops._check_aligned("sp_attention", q=aligned, k=aligned, v=aligned)
    with pytest.raises(ValueError, match=r"tessera::sp_attention: k is not 16-byte aligned \(storage offset 1\)"):
        _ops._check_aligned("sp_attention", q=aligned, k=shifted, v=aligned)


def test_sp_attention_at_tp1_matches_reference(ctx1):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 32, 4, 64, generator=g).bfloat16()
    k, v = torch.randn(1, 32, 2, 64, generator=g).bfloat16(), torch.randn(1, 32, 2, 64, generator=g).bfloat16()
    for causal in (True, False):
        o, lse = tt.sp_attention(q, k, v, ctx1, causal=causal, return_lse=True)
        kr, vr = k.repeat_interleave(2, dim=2), v.repeat_interleave(2, dim=2)
        ref = torch.nn.functional.scaled_dot_product_attention(q.float().transpose(1, 2), kr.float().transpose(1, 2),
                                                                vr.float().transpose(1, 2), is_causal=causal)
        assert rel_err(o, ref.transpose(1, 2)) < 2e-2
        assert lse.shape == (1, 4, 32) and torch.isfinite(lse).all()
    utils = ("test_schema", "test_faketensor")
    torch.library.opcheck(torch.ops.tessera.sp_attention.default, (q, k, v, ctx1.handle, True, 0.0, 0),
                          test_utils=utils)
    torch.library.opcheck(torch.ops.tessera.sp_attention_lse.default, (q, k, v, ctx1.handle, False, 0.125, 1),
                          test_utils=utils)


def test_resolve_sp_attention_checks_before_the_library():
    c = tt.Context._for_shapes(rank=0, world=2)
    kv = torch.empty(1, 64, 2, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="heads_q = 3 is not a multiple of heads_kv = 2"):
        tt.resolve_sp_attention(torch.empty(1, 64, 3, 128, dtype=torch.bfloat16), kv, kv, c)
    with pytest.raises(tessera.TesseraError, match="no library session"):
        tt.resolve_sp_attention(torch.empty(1, 64, 8, 128, dtype=torch.bfloat16), kv, kv, c)
    c.close()


@pytest.mark.parametrize("world", [1, 2, 3])
def test_zigzag_shard_round_trip(world):
    x = torch.arange(2 * 4 * world * 3).reshape(2, 4 * world, 3)
    shards = [tt.zigzag_shard(x, world, r) for r in range(world)]
    c = 2
    for r, s in enumerate(shards):
        assert s.shape == (2, 2 * c, 3)
        assert torch.equal(s[:, :c], x[:, r * c:(r + 1) * c])
        assert torch.equal(s[:, c:], x[:, (2 * world - 1 - r) * c:(2 * world - r) * c])
    assert torch.equal(tt.zigzag_unshard(shards), x)
    with pytest.raises(ValueError, match="multiple of 2 x world"):
        tt.zigzag_shard(torch.zeros(1, 6, 2), 4, 0)
    with pytest.raises(ValueError, match="rank 2 outside"):
        tt.zigzag_shard(x, 2, 2)


# ---- step-level calibration ------------------------------------------------------------------------------------
def test_greedy_overrides_keeps_only_flips_that_pay():
    a, b, c = ("ag_gemm", 8192, 3072, 4096, False), ("gemm_rs", 8192, 4096, 3072), ("gemm_rs", 8192, 4096, 7168)
    # Forcing b to sequential saves 1 ms, c costs 0.5 ms, a is noise.
    def time_ms(ov):
        return 20.0 - (1.0 if ov.get(b) else 0.0) + (0.5 if ov.get(c) else 0.0) + (0.01 if ov.get(a) else 0.0)
    chosen, times = _context.greedy_overrides([a, b, c], time_ms, margin=0.02)
    # All sequential (19.51) beats automatic by the margin, so it is the start; flipping c back to automatic pays,
    # flipping a or b does not (a's 0.01 ms is noise: it stays as started).
    assert chosen == {a: "sequential", b: "sequential"}
    assert times["automatic"] == 20.0 and times["sequential"] == 19.51
    assert len(times) == 2 + 3 + 2  # start points, one flip per call, the confirmation medians


def test_greedy_overrides_drops_a_choice_that_does_not_confirm():
    keys = [("gemm_rs", 64, 64, 64)]
    calls = []
    def time_ms(ov):  # a lucky first sample of the sequential step, then no difference
        calls.append(dict(ov))
        return 9.0 if len(calls) == 2 else 10.0
    chosen, times = _context.greedy_overrides(keys, time_ms)
    assert chosen == {}
    assert times["confirm chosen"] == times["confirm automatic"] == 10.0


def test_greedy_overrides_starts_from_all_sequential_when_it_wins():
    keys = [("gemm_rs", 64, 64, 64), ("gemm_rs", 128, 64, 64)]
    def time_ms(ov):  # every automatic call costs 2 ms
        return 10.0 + 2.0 * sum(1 for k in keys if k not in ov)
    chosen, _ = _context.greedy_overrides(keys, time_ms)
    assert chosen == {k: "sequential" for k in keys}
    assert _context.greedy_overrides(keys, time_ms, confirm_rounds=0)[0] == chosen
    assert _context.greedy_overrides([], time_ms) == ({}, {"automatic": 14.0})


def test_strategy_for_applies_overrides_to_automatic_calls_only():
    c = _context.Context._for_shapes(0, 2)
    key = ("gemm_rs", 64, 32, 16)
    c.set_overrides({key: "sequential"})
    assert c.strategy_for(key, 0) == tt.STRATEGIES["sequential"]
    assert c.strategy_for(key, tt.STRATEGIES["fused_ce"]) == tt.STRATEGIES["fused_ce"]  # explicit wins
    assert c.strategy_for(("gemm_rs", 1, 2, 3), 0) == 0
    assert c.overrides == {key: "sequential"}
    with pytest.raises(ValueError):
        c.set_overrides({key: "nonsense"})


def test_context_rejects_a_bad_workspace_limit_before_anything():
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="sp_workspace_limit_gb"):
            tt.Context(sp_workspace_limit_gb=bad)
