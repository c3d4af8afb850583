"""PyTorch front end to Tessera's tensor-parallel operators (libtessera_c.so via ctypes).

    import tessera_torch as tt
    s = tt.Session.from_torchrun()          # collective; rendezvous on MASTER_PORT + 1
    torch.cuda.set_stream(s.stream)         # or order your stream against s.stream
    s.ag_gemm(x_shard, w, out)              # out = all_gather(x_shard) @ w.T
    s.ag_gemm(x_shard, w_gate_up, out, swiglu=True)
    s.gemm_rs(hid, w_down, out_shard)       # out_shard = reduce_scatter(hid @ w_down.T)
    s.mlp(x_shard, w_gate_up, w_down, out_shard)   # both, SiLU(gate)*up between

Tensors are CUDA, contiguous, bf16 or fp16, on this rank's device; shapes
follow ops::AgGemmArgs / GemmRsArgs (B as [N, K]). The library is found from
$TESSERA_C_LIB, else the installed `tessera` package's copy, else
build*/lib/libtessera_c.so beside this folder. Errors raise TesseraError with
the library's message (nothing was launched).

This module is the older interface, kept for scripts/bench_async_tp.py: new
code uses the `tessera` package (`pip install .`; tessera.torch.Context over
a torch.distributed group, the tessera:: custom ops and autograd modules).
"""
import ctypes
import glob
import os

import torch

STRATEGIES = {"automatic": 0, "sequential": 1, "decomposition": 2, "fused_ce": 3, "fused_sm": 4, "ring": 5,
              "ulysses": 6, "pipelined": 7, "two_level": 8}
STRATEGY_NAMES = {v: k for k, v in STRATEGIES.items()}
_DTYPES = {torch.bfloat16: 0, torch.float16: 1}


class TesseraError(RuntimeError):
    pass


def find_library():
    env = os.environ.get("TESSERA_C_LIB")
    if env:
        return env
    try:  # the package's search (installed copy first), without loading it
        import importlib.util
        spec = importlib.util.find_spec("tessera")
        if spec and spec.submodule_search_locations:
            packaged = os.path.join(list(spec.submodule_search_locations)[0], "lib", "libtessera_c.so")
            if os.path.exists(packaged):
                return packaged
    except (ImportError, ValueError):
        pass
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    hits = sorted(glob.glob(os.path.join(root, "build*", "lib", "libtessera_c.so")), key=os.path.getmtime)
    if not hits:
        raise TesseraError("libtessera_c.so not found: build the tessera_c target or set TESSERA_C_LIB")
    return hits[-1]


def _load(path):
    lib = ctypes.CDLL(path)
    i64, i32, vp = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    lib.tessera_last_error.restype = ctypes.c_char_p
    lib.tessera_session_create.argtypes = [i32, i32, i32, i32, i32, ctypes.c_char_p, i32, ctypes.POINTER(vp)]
    lib.tessera_session_destroy.argtypes = [vp]
    lib.tessera_session_stream.argtypes = [vp]
    lib.tessera_session_stream.restype = vp
    lib.tessera_session_use_cache.argtypes = [vp, i32]
    lib.tessera_ag_gemm.argtypes = [vp, vp, vp, vp, i64, i64, i64, i64, i64, i32, i32, i32]
    lib.tessera_gemm_rs.argtypes = [vp, vp, vp, vp, i64, i64, i64, i64, i32, i32]
    lib.tessera_gemm_ar.argtypes = [vp, vp, vp, vp, i64, i64, i64, i32, i32]
    lib.tessera_mlp.argtypes = [vp, vp, vp, vp, vp, i64, i64, i64, i64, i32, i32, i32]
    lib.tessera_resolve.argtypes = [vp, i32, i64, i64, i64, i64, i32, i32, vp, vp, vp, ctypes.POINTER(i32)]
    return lib


def _strategy(name):
    if name not in STRATEGIES:
        raise TesseraError(f"strategy {name!r}: one of {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def _check(lib, rc):
    if rc != 0:
        raise TesseraError(lib.tessera_last_error().decode(errors="replace"))


class Session:
    """One rank's Tessera process group and operator context."""

    def __init__(self, rank, world, local_rank, local_world, master_addr, master_port, device=-1, lib=None):
        self._lib = _load(lib or find_library())
        h = ctypes.c_void_p()
        _check(self._lib, self._lib.tessera_session_create(rank, world, local_rank, local_world, device,
                                                           master_addr.encode(), master_port, ctypes.byref(h)))
        self._h = h
        self.rank, self.world = rank, world
        self.stream = torch.cuda.ExternalStream(self._lib.tessera_session_stream(h))

    @classmethod
    def from_torchrun(cls, port_offset=1, **kw):
        e = os.environ
        return cls(int(e["RANK"]), int(e["WORLD_SIZE"]), int(e.get("LOCAL_RANK", e["RANK"])),
                   int(e.get("LOCAL_WORLD_SIZE", e["WORLD_SIZE"])), e.get("MASTER_ADDR", "127.0.0.1"),
                   int(e.get("MASTER_PORT", "29500")) + port_offset, **kw)

    def close(self):
        """Collective: every rank must close (or drop) its session; the device finishes its queued work first."""
        if getattr(self, "_h", None):
            try:
                if torch.cuda.current_stream().cuda_stream == self.stream.cuda_stream:
                    torch.cuda.set_stream(torch.cuda.default_stream())  # the session's stream is about to go
            except Exception:  # noqa: BLE001 — teardown at interpreter exit: best effort
                pass
            self._lib.tessera_session_destroy(self._h)
            self._h = None

    def __del__(self):
        self.close()

    def use_cache(self, on):
        self._lib.tessera_session_use_cache(self._h, 1 if on else 0)

    @staticmethod
    def _dtype(*ts):
        d = ts[0].dtype
        dev = torch.cuda.current_device()
        for t in ts:
            if not t.is_cuda or not t.is_contiguous() or t.dim() != 2:
                raise TesseraError(f"tensors must be 2-D contiguous CUDA tensors (got {tuple(t.shape)}, "
                                   f"cuda={t.is_cuda}, contiguous={t.is_contiguous()})")
            if t.device.index != dev:
                raise TesseraError(f"tensor on cuda:{t.device.index}, but this rank's device is cuda:{dev}")
            if t.dtype != d:
                raise TesseraError(f"dtype mismatch: {t.dtype} vs {d}")
        if d not in _DTYPES:
            raise TesseraError(f"dtype {d}: bf16 or fp16 only")
        return _DTYPES[d]

    @staticmethod
    def _need(cond, msg):
        if not cond:
            raise TesseraError(msg)

    def ag_gemm(self, a_shard, b, out, swiglu=False, strategy="automatic"):
        """out[M, N or N/2] = all_gather(a_shard[M/R, K]) @ b[N, K].T (SiLU(gate)*up with swiglu)."""
        dt = self._dtype(a_shard, b, out)
        m = out.shape[0]
        self._need(a_shard.shape[1] == b.shape[1], f"ag_gemm: A shard has K = {a_shard.shape[1]}, B has K = {b.shape[1]}")
        n_out = b.shape[0] // 2 if swiglu else b.shape[0]
        self._need(out.shape[1] == n_out, f"ag_gemm: out has {out.shape[1]} columns, expected {n_out}"
                                          + (" (N/2 with swiglu)" if swiglu else ""))
        _check(self._lib, self._lib.tessera_ag_gemm(self._h, a_shard.data_ptr(), b.data_ptr(), out.data_ptr(), m,
                                                    a_shard.shape[0], b.shape[0], b.shape[1], out.shape[1], dt,
                                                    1 if swiglu else 0, _strategy(strategy)))

    def gemm_rs(self, a, b, out, strategy="automatic"):
        """out[M/R, N] = this rank's rows of reduce_scatter(a[M, K] @ b[N, K].T)."""
        dt = self._dtype(a, b, out)
        self._need(a.shape[1] == b.shape[1], f"gemm_rs: A has K = {a.shape[1]}, B has K = {b.shape[1]}")
        self._need(out.shape[1] == b.shape[0], f"gemm_rs: out has {out.shape[1]} columns, B has N = {b.shape[0]}")
        _check(self._lib, self._lib.tessera_gemm_rs(self._h, a.data_ptr(), b.data_ptr(), out.data_ptr(), a.shape[0],
                                                    out.shape[0], b.shape[0], b.shape[1], dt, _strategy(strategy)))

    def gemm_ar(self, a, b, out, strategy="automatic"):
        """out[M, N] = all_reduce(a[M, K] @ b[N, K].T), the same on every rank."""
        dt = self._dtype(a, b, out)
        self._need(a.shape[1] == b.shape[1], f"gemm_ar: A has K = {a.shape[1]}, B has K = {b.shape[1]}")
        self._need(out.shape == (a.shape[0], b.shape[0]),
                   f"gemm_ar: out is {tuple(out.shape)}, expected {(a.shape[0], b.shape[0])}")
        _check(self._lib, self._lib.tessera_gemm_ar(self._h, a.data_ptr(), b.data_ptr(), out.data_ptr(), a.shape[0],
                                                    b.shape[0], b.shape[1], dt, _strategy(strategy)))

    def mlp(self, x_shard, w_gate_up, w_down, out_shard, m=None, ag_strategy="automatic", rs_strategy="automatic"):
        """out_shard[M/R, H] = this rank's rows of the TP MLP layer: all_gather(x_shard) through the fused gate/up
        weight [2·I/R, H] (SiLU(gate)*up) and the down weight [H, I/R], reduce-scattered. m: total tokens; the
        default (x_shard rows × world size) holds for equal shards only: pass m when the last shard is shorter."""
        dt = self._dtype(x_shard, w_gate_up, w_down, out_shard)
        h, i_local = x_shard.shape[1], w_down.shape[1]
        self._need(w_gate_up.shape == (2 * i_local, h),
                   f"mlp: w_gate_up is {tuple(w_gate_up.shape)}, expected {(2 * i_local, h)}")
        self._need(w_down.shape[0] == h, f"mlp: w_down has {w_down.shape[0]} rows, expected H = {h}")
        self._need(out_shard.shape == x_shard.shape,
                   f"mlp: out is {tuple(out_shard.shape)}, expected the token shard's {tuple(x_shard.shape)}")
        m = x_shard.shape[0] * self.world if m is None else m
        _check(self._lib, self._lib.tessera_mlp(self._h, x_shard.data_ptr(), w_gate_up.data_ptr(), w_down.data_ptr(),
                                                out_shard.data_ptr(), m, x_shard.shape[0], h, i_local, dt,
                                                _strategy(ag_strategy), _strategy(rs_strategy)))

    def resolve_ag_gemm(self, a_shard, b, out, swiglu=False):
        """The strategy `automatic` picks for this AG+GEMM (tunes if needed; collective)."""
        r = ctypes.c_int()
        _check(self._lib, self._lib.tessera_resolve(self._h, 0, out.shape[0], a_shard.shape[0], b.shape[0], b.shape[1],
                                                    self._dtype(a_shard, b, out), 1 if swiglu else 0,
                                                    a_shard.data_ptr(), b.data_ptr(), out.data_ptr(), ctypes.byref(r)))
        return STRATEGY_NAMES[r.value]

    def resolve_gemm_rs(self, a, b, out):
        r = ctypes.c_int()
        _check(self._lib, self._lib.tessera_resolve(self._h, 1, a.shape[0], out.shape[0], b.shape[0], b.shape[1],
                                                    self._dtype(a, b, out), 0, a.data_ptr(), b.data_ptr(),
                                                    out.data_ptr(), ctypes.byref(r)))
        return STRATEGY_NAMES[r.value]
