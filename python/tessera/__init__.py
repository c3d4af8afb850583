"""Tessera: overlapped tensor-parallel GEMM + collective operators for Hopper GPUs.

    import tessera                      # loads libtessera_c, checks NCCL
    import tessera.torch as tt          # PyTorch front end (needs torch)
    with tt.Context(group=tp_group) as ctx:
        layer = tt.ColumnParallelLinear(4096, 14336, ctx, bias=False)

`python -m tessera.env` reports GPUs, links and NCCL.
"""
import os as _os

from ._lib import NcclVersionWarning, TesseraError, build_info, library_path  # noqa: F401
from . import _lib


def _read_version():
    here = _os.path.dirname(_os.path.abspath(__file__))
    info = build_info()
    if info:
        return info["version"]
    try:  # source checkout: the repository's VERSION file
        with open(_os.path.join(here, "..", "..", "VERSION")) as f:
            return f.read().strip()
    except OSError:
        return "unknown"


__version__ = _read_version()

#: Why the library could not be loaded at import (None when it was).
library_error = None
#: (built-with, loaded) NCCL versions, when the library loaded.
nccl_versions = None
try:
    _lib.load()
    nccl_versions = _lib.check_nccl()
except TesseraError as _e:
    if "NCCL" in str(_e) and "built with" in str(_e):
        raise  # TESSERA_STRICT_NCCL=1 and a mismatch
    library_error = str(_e)
