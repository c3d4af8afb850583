"""Finding and loading libtessera_c.so (ctypes), and the NCCL version check.

Search order: $TESSERA_C_LIB; the copy installed inside this package
(tessera/lib/, by `pip install .`); in a source checkout, the newest
build*/lib/libtessera_c.so beside python/.
"""
import ctypes
import glob
import json
import os
import warnings

_HERE = os.path.dirname(os.path.abspath(__file__))
UNIQUE_ID_BYTES = 128
# Operator flags (tessera.h): ag_gemm's SiLU*up epilogue; B given as [K, N] (ag_gemm, gemm_rs).
AG_SWIGLU = 1
B_KN = 2


class TesseraError(RuntimeError):
    """An error reported by the library (its message names the argument) or by the front end."""


class NcclVersionWarning(RuntimeWarning):
    """The NCCL library the loader picked is not the one Tessera was built with."""


def library_candidates():
    env = os.environ.get("TESSERA_C_LIB")
    if env:
        return [env]
    out = []
    packaged = os.path.join(_HERE, "lib", "libtessera_c.so")
    if os.path.exists(packaged):
        out.append(packaged)
    root = os.path.dirname(os.path.dirname(_HERE))  # python/tessera -> repository root
    out += sorted(glob.glob(os.path.join(root, "build*", "lib", "libtessera_c.so")), key=os.path.getmtime,
                  reverse=True)
    return out


def build_info():
    """What the packaged library was built against (None in a source checkout)."""
    p = os.path.join(_HERE, "lib", "build_info.json")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)


def _prototypes(lib):
    i64, i32, vp, cp = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p
    pi = ctypes.POINTER(i32)
    sig = {
        "tessera_last_error": ([], cp),
        "tessera_version": ([], cp),
        "tessera_nccl_versions": ([pi, pi], i32),
        "tessera_nccl_unique_id": ([vp, i32], i32),
        "tessera_session_create_from_id": ([i32, i32, i32, ctypes.c_char_p, i32, i32, ctypes.POINTER(vp)], i32),
        "tessera_session_destroy": ([vp], None),
        "tessera_session_abort": ([vp], None),
        "tessera_session_rank": ([vp], i32),
        "tessera_session_world": ([vp], i32),
        "tessera_session_device": ([vp], i32),
        "tessera_session_lsa_reachable": ([vp], i32),
        "tessera_session_stream": ([vp], vp),
        "tessera_session_use_cache": ([vp, i32], None),
        "tessera_session_tune_on_miss": ([vp, i32], None),
        "tessera_session_sp_workspace_limit": ([vp, ctypes.c_uint64], None),
        "tessera_session_sp_two_level_inner": ([vp, i32], None),
        "tessera_ag_gemm_ex": ([vp, vp, vp, vp, vp, vp, i64, i64, i64, i64, i64, i32, i32, i32], i32),
        "tessera_gemm_rs_ex": ([vp, vp, vp, vp, vp, i64, i64, i64, i64, i32, i32], i32),
        "tessera_gemm_rs_ex2": ([vp, vp, vp, vp, vp, i64, i64, i64, i64, i32, i32, i32], i32),
        "tessera_gemm_ar_ex": ([vp, vp, vp, vp, vp, i64, i64, i64, i32, i32], i32),
        "tessera_mlp_ex": ([vp, vp, vp, vp, vp, vp, i64, i64, i64, i64, i32, i32, i32], i32),
        "tessera_resolve": ([vp, i32, i64, i64, i64, i64, i32, i32, vp, vp, vp, pi], i32),
        "tessera_transpose": ([vp, vp, vp, i64, i64, i32], i32),
        "tessera_strategy_name": ([i32], ctypes.c_char_p),
        "tessera_strategy_accepts": ([i32, i32], i32),
        "tessera_swiglu_forward": ([vp, vp, vp, i64, i64, i32], i32),
        "tessera_swiglu_backward": ([vp, vp, vp, vp, vp, i64, i64, i32], i32),
        "tessera_sp_attention_ex": ([vp, vp, vp, vp, vp, vp, vp, i64, i64, i64, i64, i64, i32, i32, ctypes.c_float,
                                     i32], i32),
        "tessera_sp_attention_resolve": ([vp, vp, vp, vp, vp, i64, i64, i64, i64, i64, i32, i32, pi], i32),
        "tessera_moe_tp_ex": ([vp, vp, vp, vp, vp, vp, vp, vp, i64, i64, i64, i32, i32, i32, i32], i32),
        "tessera_moe_tp_resolve": ([vp, vp, vp, vp, vp, vp, vp, i64, i64, i64, i32, i32, i32, pi], i32),
        "tessera_moe_tp_check_status": ([vp], i32),
        "tessera_moe_ep_ex": ([vp, vp, vp, vp, vp, vp, vp, vp, i64, i64, i64, i32, i32, i64, i32, i32], i32),
        "tessera_moe_ep_check_status": ([vp], i32),
        "tessera_moe_topk_gating": ([vp, vp, vp, vp, i64, i32, i32, i64, i32, i32], i32),
        "tessera_device_count": ([pi], i32),
        "tessera_can_access_peer": ([i32, i32, pi], i32),
        "tessera_lsa_probe": ([i32, pi], i32),
    }
    for name, (args, res) in sig.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = res
    return lib


_lib = None
_lib_path = None


def load():
    """The loaded library (loads it on first use); raises TesseraError naming what was tried."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    tried = []
    for path in library_candidates():
        try:
            _lib = _prototypes(ctypes.CDLL(path))
            _lib_path = path
            return _lib
        except (OSError, AttributeError) as e:
            tried.append(f"{path}: {e}")
    raise TesseraError("libtessera_c.so not found or not loadable: install the package (pip install .), build the "
                       "tessera_c target, or set TESSERA_C_LIB" + ("; tried " + "; ".join(tried) if tried else ""))


def library_path():
    return _lib_path


def check(rc):
    if rc != 0:
        raise TesseraError(load().tessera_last_error().decode(errors="replace"))


def version_string(code):
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}" if code >= 10000 else f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def nccl_versions():
    """(built-with, loaded) NCCL versions as 'X.Y.Z' strings."""
    lib = load()
    h, r = ctypes.c_int(), ctypes.c_int()
    check(lib.tessera_nccl_versions(ctypes.byref(h), ctypes.byref(r)))
    return version_string(h.value), version_string(r.value)


def loaded_nccl_path():
    """Path of the libnccl the process has loaded (from /proc/self/maps), or None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if "libnccl.so" in line:
                    return line.split()[-1]
    except OSError:
        pass
    return None


def check_nccl(strict=None):
    """Compares the NCCL header Tessera was built with to the library loaded now.
    A difference is a RuntimeWarning naming both (TESSERA_STRICT_NCCL=1: TesseraError); creating a
    communicator refuses it anyway (ProcessGroup checks the same). Returns (built, loaded)."""
    built, loaded = nccl_versions()
    if built != loaded:
        info = build_info() or {}
        msg = (f"Tessera was built with NCCL {built}" + (f" ({info['nccl_library']})" if info.get("nccl_library") else "")
               + f" but the process loaded NCCL {loaded} ({loaded_nccl_path() or 'unknown path'}): the device API's "
               "structs differ between releases. Import tessera before torch, point LD_LIBRARY_PATH at the same "
               "copy, or rebuild against the loaded one (TESSERA_NCCL_ROOT).")
        if strict if strict is not None else os.environ.get("TESSERA_STRICT_NCCL", "0") == "1":
            raise TesseraError(msg)
        warnings.warn(msg, NcclVersionWarning, stacklevel=3)
    return built, loaded
