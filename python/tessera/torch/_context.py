"""tessera.torch.Context: Tessera's communicator and operator context over the
ranks of a torch.distributed process group."""
import ctypes
import os
import socket
import warnings
import weakref

import torch

from .. import _lib
from .._lib import TesseraError

# The library's strategy table (ops::strategy_table), as names by code. It is
# spelled here so that the fake implementations work without the library;
# check_strategy_table() compares it with the library's when a context opens.
STRATEGIES = {"automatic": 0, "sequential": 1, "decomposition": 2, "fused_ce": 3, "fused_sm": 4, "ring": 5,
              "ulysses": 6, "pipelined": 7, "two_level": 8}


def check_strategy_table(lib):
    """Raises TesseraError unless the library names every code as STRATEGIES does (a package and a library of
    different versions)."""
    for name, code in STRATEGIES.items():
        got = lib.tessera_strategy_name(code)
        got = got.decode() if got is not None else None
        if got != name:
            raise TesseraError(f"strategy code {code} is {name!r} here but {got!r} in {_lib.library_path()}: the "
                               "tessera package and its library come from different versions")
    if lib.tessera_strategy_name(len(STRATEGIES)) is not None:
        raise TesseraError(f"the library {_lib.library_path()} knows more strategies than this package")

# handle -> weakref(Context): the custom ops take the handle (an int, so
# torch.compile treats it as a constant) and look the context up here.
_REGISTRY = {}
_NEXT_HANDLE = [1]


def strategy_code(name):
    if isinstance(name, int) and name in STRATEGIES.values():
        return name
    if name not in STRATEGIES:
        raise ValueError(f"strategy {name!r}: one of {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def lookup(handle):
    ref = _REGISTRY.get(handle)
    ctx = ref() if ref is not None else None
    if ctx is None:
        raise TesseraError(f"tessera context handle {handle} is closed or unknown")
    return ctx


def shard_rows(m, world, rank):
    """Rows of rank's shard of m rows (ops::shard_rows: ceil(m / world) each, the last shards shorter)."""
    per = -(-m // world)
    return max(0, min(per, m - rank * per))


def tuning_shapes(module, m, training=True):
    """The (op, m, n, k[, ...flags]) shapes that `module`'s tessera layers run with strategy automatic at m tokens
    (forward, and backward when training), for Context.pretune. The backward's dX GEMMs take the weight as B
    [K, N]: ("gemm_rs", m, n, k, True) and ("ag_gemm", m, n, k, False, True)."""
    from . import modules as tm
    auto = STRATEGIES["automatic"]
    out = []
    for mod in module.modules():
        if isinstance(mod, tm.ColumnParallelLinear):
            if mod.strategy == auto:
                out.append(("ag_gemm", m, mod.out_per_rank, mod.in_features))
            if training and mod.backward_strategy == auto:
                out.append(("gemm_rs", m, mod.in_features, mod.out_per_rank, True))
        elif isinstance(mod, tm.RowParallelLinear):
            if mod.strategy == auto:
                out.append(("gemm_rs", m, mod.out_features, mod.in_per_rank))
            if training and mod.backward_strategy == auto:
                out.append(("ag_gemm", m, mod.in_per_rank, mod.out_features, False, True))
        elif isinstance(mod, tm.TensorParallelMLP):
            h, i = mod.hidden, mod.i_per_rank
            if mod.strategy == auto:
                out.append(("ag_gemm", m, 2 * i, h) if training else ("ag_gemm", m, 2 * i, h, True))
                if training:
                    out.append(("gemm_rs", m, h, 2 * i, True))
            if mod.rs_strategy == auto:
                out.append(("gemm_rs", m, h, i))
                if training:
                    out.append(("ag_gemm", m, i, h, False, True))
    seen, uniq = set(), []
    for s in out:
        if s not in seen:
            seen.add(s)
            uniq.append(s)
    return uniq


def _device_key(dev):
    p = torch.cuda.get_device_properties(dev)
    ident = getattr(p, "uuid", None) or getattr(p, "pci_bus_id", None) or f"{p.name}#{dev}"
    return f"{socket.gethostname()}/{ident}"


def greedy_overrides(keys, time_ms, margin=0.02, confirm_rounds=3):
    """The step-level choice behind Context.calibrate, given `time_ms(overrides) -> ms` (the step's time with those
    operator calls forced to sequential; the same on every rank). Starts from whichever of "all automatic" and "all
    sequential" is faster (the latter must win by `margin`), then flips one call at a time to the other and keeps a
    flip that is faster by `margin`. A search over noisy timings favours lucky samples, so the result must then
    beat "all automatic" again in `confirm_rounds` fresh rounds, the two timed alternately (medians, by half the
    margin); otherwise no override is kept. Returns (overrides {key: "sequential"}, {label: ms} of every
    timing)."""
    keys = list(keys)
    times = {"automatic": time_ms({})}
    all_seq = {k: "sequential" for k in keys}
    if not keys:
        return {}, times
    times["sequential"] = time_ms(all_seq)
    current = dict(all_seq) if times["sequential"] < times["automatic"] * (1 - margin) else {}
    best = min(times["automatic"], times["sequential"]) if current else times["automatic"]
    for k in keys:
        trial = dict(current)
        if k in trial:
            del trial[k]
        else:
            trial[k] = "sequential"
        t = time_ms(trial)
        times[("automatic " if k not in trial else "sequential ") + " ".join(map(str, k))] = t
        if t < best * (1 - margin):
            current, best = trial, t
    if current and confirm_rounds > 0:
        chosen, auto = [], []
        for _ in range(confirm_rounds):
            chosen.append(time_ms(current))
            auto.append(time_ms({}))
        chosen.sort()
        auto.sort()
        times["confirm chosen"] = chosen[len(chosen) // 2]
        times["confirm automatic"] = auto[len(auto) // 2]
        if not times["confirm chosen"] < times["confirm automatic"] * (1 - margin / 2):
            current = {}
    return current, times


class Context:
    """Tessera's communicator over exactly the ranks of `group` (a torch.distributed ProcessGroup; None: the
    default group, or a one-rank context when torch.distributed is not initialized).

    Collective over the group: every rank of it constructs the context at the same point. The NCCL unique id is
    created on the group's rank 0 and broadcast through the group; Tessera opens no port. Several contexts (over
    several groups) can live in one process. Teardown is explicit and collective: `close()` on every rank, or
    `with Context(...) as ctx:`. A context dropped without close() is leaked with a ResourceWarning: nothing
    collective runs from __del__.

    device: this rank's CUDA device (default: the current one). timeout_s bounds each host-side exchange
    (shape agreement, tuning) over the communicator. use_cache: whether `automatic` reads/writes the on-disk
    strategy cache. tune_on_miss: what `automatic` does for a shape never measured (by pretune, `tessera tune`
    or an earlier run): False (default) takes the nearest measured shape's choice, or sequential, so a training
    or serving step never stops for a collective tuning pass; True measures the candidates inside that call.
    sp_workspace_limit_gb: workspace per rank that sp_attention may use beyond its shards (None or 0: no limit);
    `automatic` then chooses among the schedules that fit (ring needs two KV shards, the all-gather the whole
    sequence's K and V), and an explicit strategy over it is refused.
    sp_two_level_inner: the Ulysses degree u of sp_attention's "two_level" schedule (Ulysses inside groups of u
    ranks, ring across world / u groups): a divisor of the world dividing both head counts (checked by the call);
    None or 0: chosen by the library.
    """

    def __init__(self, group=None, device=None, timeout_s=None, use_cache=True, tune_on_miss=False,
                 sp_workspace_limit_gb=None, sp_two_level_inner=None):
        self._h = None
        self.handle = None
        self._overrides, self._seen = {}, None
        if sp_workspace_limit_gb is not None and not (0 <= sp_workspace_limit_gb < float("inf")):
            raise ValueError(f"sp_workspace_limit_gb = {sp_workspace_limit_gb}: a finite number >= 0 (0: no limit)")
        if sp_two_level_inner is not None and (not isinstance(sp_two_level_inner, int) or sp_two_level_inner < 0):
            raise ValueError(f"sp_two_level_inner = {sp_two_level_inner!r}: an int >= 0 (0: chosen)")
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            self.group = group if group is not None else dist.group.WORLD
            self.rank = dist.get_rank(self.group)
            if self.rank < 0:
                raise ValueError("group: this process is not a member of the process group it passed")
            self.world = dist.get_world_size(self.group)
        else:
            if group is not None:
                raise ValueError("group: torch.distributed is not initialized, so no group can be used")
            self.group, self.rank, self.world = None, 0, 1

        if device is None:
            if not torch.cuda.is_available():
                raise TesseraError("tessera.torch.Context needs a CUDA device; none is available")
            device = torch.cuda.current_device()
        device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"device: {device} is not a CUDA device")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device

        lib = _lib.load()
        check_strategy_table(lib)
        # Every rank of the group on this node, each on its own GPU (the operators need load/store reach).
        if self.world > 1:
            keys = [None] * self.world
            with torch.cuda.device(device):
                dist.all_gather_object(keys, _device_key(device), group=self.group)
            hosts = sorted({k.split("/", 1)[0] for k in keys})
            if len(hosts) > 1:
                raise ValueError(f"group: its ranks span hosts {', '.join(hosts)}; Tessera's operators need every "
                                 "rank of the group on one node, load/store reachable (NVLink/P2P)")
            dup = [(a, b) for a in range(self.world) for b in range(a + 1, self.world) if keys[a] == keys[b]]
            if dup:
                raise ValueError(f"group: ranks {dup[0][0]} and {dup[0][1]} of the group use the same GPU "
                                 f"({keys[dup[0][0]]}); each rank needs its own")

        uid = ctypes.create_string_buffer(_lib.UNIQUE_ID_BYTES)
        if self.rank == 0:
            _lib.check(lib.tessera_nccl_unique_id(uid, _lib.UNIQUE_ID_BYTES))
        if self.world > 1:
            obj = [uid.raw if self.rank == 0 else None]
            with torch.cuda.device(device):
                dist.broadcast_object_list(obj, src=dist.get_global_rank(self.group, 0), group=self.group)
            uid = ctypes.create_string_buffer(obj[0], _lib.UNIQUE_ID_BYTES)
        timeout_ms = int(timeout_s * 1000) if timeout_s else 0
        h = ctypes.c_void_p()
        with torch.cuda.device(device):
            _lib.check(lib.tessera_session_create_from_id(self.rank, self.world, device.index, uid.raw,
                                                          _lib.UNIQUE_ID_BYTES, timeout_ms, ctypes.byref(h)))
        self._h = h
        self._lib = lib
        lib.tessera_session_use_cache(h, 1 if use_cache else 0)
        lib.tessera_session_tune_on_miss(h, 1 if tune_on_miss else 0)
        if sp_workspace_limit_gb:
            lib.tessera_session_sp_workspace_limit(h, int(sp_workspace_limit_gb * (1 << 30)))
        if sp_two_level_inner:
            lib.tessera_session_sp_two_level_inner(h, int(sp_two_level_inner))
        net_only = os.environ.get("TESSERA_NO_LSA", "0") == "1" or os.environ.get("TESSERA_TOPOLOGY") == "net"
        if not lib.tessera_session_lsa_reachable(h) and not net_only:
            self.close()
            raise ValueError(f"group: its {self.world} ranks are not all load/store reachable from each other "
                             "(NCCL's LSA team is smaller); Tessera's fused operators need NVLink/P2P between every pair "
                             "(TESSERA_NO_LSA=1 asks for the NCCL-based strategies only)")
        self._register()

    @classmethod
    def _for_shapes(cls, rank, world, device="cpu"):
        """A context with no library session: shapes only (fake/meta tensors, CPU tests)."""
        self = cls.__new__(cls)
        self._h, self._lib, self.group = None, None, None
        self._overrides, self._seen = {}, None
        self.rank, self.world, self.device = rank, world, torch.device(device)
        self._register()
        return self

    def _register(self):
        self.handle = _NEXT_HANDLE[0]
        _NEXT_HANDLE[0] += 1
        _REGISTRY[self.handle] = weakref.ref(self)

    @property
    def closed(self):
        return self.handle not in _REGISTRY

    @property
    def session(self):
        if self._h is None:
            raise TesseraError(f"tessera context {self.handle} has no library session (closed, or shapes only)")
        return self._h

    def close(self):
        """Collective over the group: waits for this device's queued work, then frees the communicator."""
        _REGISTRY.pop(self.handle, None)
        if getattr(self, "_h", None) is not None:
            h, self._h = self._h, None
            self._lib.tessera_session_destroy(h)

    def abort(self):
        """After a peer failed (a timed-out exchange): abort the communicator, then free it (not collective)."""
        _REGISTRY.pop(self.handle, None)
        if getattr(self, "_h", None) is not None:
            h, self._h = self._h, None
            self._lib.tessera_session_abort(h)
            self._lib.tessera_session_destroy(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        if getattr(self, "_h", None) is not None:
            # Not collective from here (peers may not be here): leak and say so.
            warnings.warn(f"tessera.torch.Context {self.handle} (rank {self.rank} of {self.world}) was not closed; "
                          "its communicator is leaked. Call close() on every rank or use it as a context manager.",
                          ResourceWarning, stacklevel=2)

    def __repr__(self):
        state = "closed" if self.closed else ("shapes-only" if self._h is None else "open")
        return f"tessera.torch.Context(rank={self.rank}, world={self.world}, device={self.device}, {state})"

    # ---- tuning ahead of the step ------------------------------------------------------------------------------
    def pretune(self, shapes, dtype=torch.bfloat16):
        """Makes `automatic`'s choice now for each shape, so the training or serving step finds it made (in this
        context, and in the on-disk cache when use_cache). Collective: every rank of the group, the same list.

        shapes: as the operators are called — ('ag_gemm', m, n, k[, swiglu[, b_kn]]) (m total rows, B [n, k], or
        [k, n] with b_kn) or ('gemm_rs', m, n, k[, b_kn]) (A [m, k], B [n, k] or [k, n]); for a model,
        tuning_shapes(model, tokens) lists them:
            ctx.pretune(tt.tuning_shapes(model, 8192))
        Returns {shape: strategy name}. A choice is stored for the exact shape and serves, with
        tune_on_miss off, the shapes near it (within a factor 2 per dimension) as well."""
        names = {v: k for k, v in STRATEGIES.items()}
        codes = {"ag_gemm": 0, "gemm_rs": 1}
        dt = {torch.bfloat16: 0, torch.float16: 1}[dtype]
        torch.cuda.current_stream(self.device).synchronize()
        out = {}
        for s in shapes:
            op, m, n, k, *rest = s
            if op not in codes:
                raise ValueError(f"pretune: op {op!r} (ag_gemm or gemm_rs)")
            if len(rest) > (2 if op == "ag_gemm" else 1):
                raise ValueError(f"pretune: shape {tuple(s)}: ('ag_gemm', m, n, k[, swiglu[, b_kn]]) or "
                                 "('gemm_rs', m, n, k[, b_kn])")
            if op == "gemm_rs":
                rest = [False] + rest
            swiglu = bool(rest[0]) if rest else False
            b_kn = bool(rest[1]) if len(rest) > 1 else False
            ml = shard_rows(m, self.world, self.rank)
            def buf(r, c):
                return torch.randn(r, c, device=self.device, dtype=dtype).mul_(0.01)
            a = buf(ml, k) if op == "ag_gemm" else buf(m, k)
            d = buf(m, n // 2 if swiglu else n) if op == "ag_gemm" else buf(ml, n)
            b = buf(k, n) if b_kn else buf(n, k)
            flags = (_lib.AG_SWIGLU if swiglu else 0) | (_lib.B_KN if b_kn else 0)
            r = ctypes.c_int()
            _lib.check(self._lib.tessera_resolve(self.session, codes[op], m, ml, n, k, dt, flags,
                                                 a.data_ptr(), b.data_ptr(), d.data_ptr(), ctypes.byref(r)))
            out[tuple(s)] = names[r.value]
        torch.cuda.synchronize(self.device)
        return out

    # ---- step-level choice ------------------------------------------------------------------------------------
    def strategy_for(self, key, code):
        """The strategy code an operator call runs: `code` unless it is automatic (0) and calibrate() or
        set_overrides() forced this call's key — (op, m, n, k), ("ag_gemm", m, n, k, swiglu), either with a True
        appended for B as [K, N] (b_kn) — to another."""
        if code != 0:
            return code
        if self._seen is not None:
            self._seen.add(key)
        return strategy_code(self._overrides.get(key, "automatic"))

    @property
    def overrides(self):
        """{call key: strategy name} that automatic calls of this context run instead (calibrate's result)."""
        return dict(self._overrides)

    def set_overrides(self, overrides):
        """Replaces the overrides (e.g. a calibrate() result saved from an earlier run). Every rank the same."""
        for k, v in overrides.items():
            strategy_code(v)
        self._overrides = dict(overrides)

    def calibrate(self, step, warmup=2, reps=5, margin=0.02):
        """Chooses, for the whole `step`, which automatic operator calls run sequential instead.

        Each operator's automatic choice is measured alone (pretune); inside a training step its neighbours, the
        clock state and the ranks' drift change what overlaps, and a choice that wins alone can lose there. This
        times `step()` (collective, repeatable: forward and backward, no optimizer step) with every automatic call
        as chosen, with all of them sequential, and with each call flipped in turn, then confirms the result
        against all-automatic in fresh alternating rounds (greedy_overrides: len(calls) + 8 timings of warmup +
        reps steps, medians, max over ranks so every rank decides alike). The result stays in this context
        (overrides) for later steps. Returns {"overrides": ..., "times_ms": ...}."""
        import statistics

        import torch.distributed as dist

        self._overrides, self._seen = {}, set()
        try:
            step()
        finally:
            keys, self._seen = sorted(self._seen, key=repr), None
        torch.cuda.synchronize(self.device)

        def time_ms(overrides):
            self._overrides = dict(overrides)
            for _ in range(warmup):
                step()
            samples = []
            for _ in range(reps):
                if self.world > 1:
                    dist.barrier(group=self.group)
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                step()
                b.record()
                b.synchronize()
                samples.append(a.elapsed_time(b))
            t = torch.tensor([statistics.median(samples)], device=self.device)
            if self.world > 1:
                dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
            return t.item()

        try:
            chosen, times = greedy_overrides(keys, time_ms, margin)
        finally:
            self._overrides = {}
        self._overrides = chosen
        return {"overrides": dict(chosen), "times_ms": times}

    # ---- operator shortcuts (torch.ops.tessera.*) -------------------------------------------------------------
    def ag_gemm(self, a_shard, b, m=None, swiglu=False, strategy="automatic"):
        """all_gather(a_shard) @ b.T (SiLU(gate)*up with swiglu); m: total rows (default: equal shards)."""
        m = a_shard.shape[0] * self.world if m is None else m
        return torch.ops.tessera.ag_gemm(a_shard, b, self.handle, m, swiglu, strategy_code(strategy))

    def gemm_rs(self, a, b, strategy="automatic"):
        """This rank's rows of reduce_scatter(a @ b.T)."""
        return torch.ops.tessera.gemm_rs(a, b, self.handle, strategy_code(strategy))

    def gemm_ar(self, a, b, strategy="automatic"):
        """all_reduce(a @ b.T), the same on every rank."""
        return torch.ops.tessera.gemm_ar(a, b, self.handle, strategy_code(strategy))

    def moe_tp(self, x_shard, expert_ids, weights, w_gate_up, w_down, strategy="automatic"):
        """This rank's tokens of the tensor-parallel MoE layer (torch.ops.tessera.moe_tp; forward only)."""
        return torch.ops.tessera.moe_tp(x_shard, expert_ids, weights, w_gate_up, w_down, self.handle,
                                        strategy_code(strategy))

    def moe_ep(self, x_shard, expert_ids, weights, w_gate_up, w_down, capacity=0, strategy="automatic"):
        """This rank's tokens of the expert-parallel MoE layer (torch.ops.tessera.moe_ep; forward only)."""
        return torch.ops.tessera.moe_ep(x_shard, expert_ids, weights, w_gate_up, w_down, self.handle, capacity,
                                        strategy_code(strategy))

    def moe_tp_check_status(self):
        """Waits for this context's last moe_tp call and raises TesseraError if it met an expert id outside
        [0, experts) (those entries were left out of the output) or a routing table the grouped GEMM refused."""
        session = self.session
        _lib.check(self._lib.tessera_moe_tp_check_status(session))

    def moe_ep_check_status(self):
        """Waits for this context's last moe_ep call and raises TesseraError if it met an expert id outside
        [0, experts) or more rows for a rank than the capacity (left out of the output; the message gives the
        capacity that would have fit), or a routing table the grouped GEMM refused."""
        session = self.session
        _lib.check(self._lib.tessera_moe_ep_check_status(session))

    def resolve_moe_tp(self, x_shard, expert_ids, weights, w_gate_up, w_down):
        """The strategy name moe_tp's `automatic` runs for this shape (collective; a shape never measured is
        measured now, which runs the layer, whatever tune_on_miss says)."""
        from ._ops import _DTYPES, _moe_pointers, _moe_shapes
        t, h, i, e, k = _moe_shapes("moe_tp", self, True, x_shard, expert_ids, weights, w_gate_up, w_down, 0, 1)
        session = self.session
        out = torch.empty_like(x_shard)
        px, pids, pw, pout, _keep = _moe_pointers("moe_tp", x_shard, expert_ids, weights, w_gate_up, w_down, out)
        r = ctypes.c_int()
        torch.cuda.current_stream(self.device).synchronize()
        _lib.check(self._lib.tessera_moe_tp_resolve(session, px, pids, pw, w_gate_up.data_ptr(),
                                                    w_down.data_ptr(), pout, t, h, i, e, k, _DTYPES[x_shard.dtype],
                                                    ctypes.byref(r)))
        return {v: n for n, v in STRATEGIES.items()}[r.value]

    def mlp(self, x_shard, w_gate_up, w_down, m=None, ag_strategy="automatic", rs_strategy="automatic"):
        """This rank's rows of the TP MLP: RS(SiLU(gate)*up(AG(x) @ w_gate_up.T) @ w_down.T)."""
        m = x_shard.shape[0] * self.world if m is None else m
        return torch.ops.tessera.mlp(x_shard, w_gate_up, w_down, self.handle, m, strategy_code(ag_strategy),
                                     strategy_code(rs_strategy))
