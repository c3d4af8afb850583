"""CPU test of python/tessera_torch.py's argument checks: a bad call raises
TesseraError before the library is called (no GPU, no PyTorch: a stub
`torch` module stands in for the few attributes the wrapper reads)."""
import os
import sys
import types
import unittest


def install_fake_torch():
    torch = types.ModuleType("torch")
    torch.bfloat16, torch.float16, torch.float32 = "bf16", "f16", "f32"
    cuda = types.SimpleNamespace(current_device=lambda: 0, ExternalStream=lambda ptr: ("stream", ptr))
    torch.cuda = cuda
    sys.modules["torch"] = torch
    return torch


class FakeTensor:
    def __init__(self, rows, cols, dtype="bf16", device=0, contiguous=True, cuda=True, ptr=0x1000):
        self.shape = (rows, cols)
        self.dtype = dtype
        self.device = types.SimpleNamespace(index=device)
        self.is_cuda = cuda
        self._contiguous = contiguous
        self._ptr = ptr

    def is_contiguous(self):
        return self._contiguous

    def dim(self):
        return len(self.shape)

    def data_ptr(self):
        return self._ptr


class RecordingLib:
    """Stands in for libtessera_c.so: records every operator call, succeeds."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def fn(*args):
            self.calls.append((name, args))
            return 0
        return fn


class ArgumentChecks(unittest.TestCase):
    def setUp(self):
        install_fake_torch()
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
        import tessera_torch
        self.tt = tessera_torch
        self.s = tessera_torch.Session.__new__(tessera_torch.Session)  # no library, no rendezvous
        self.s._lib = RecordingLib()
        self.s._h = 1

    def assert_rejected(self, fn, text):
        with self.assertRaises(self.tt.TesseraError) as cm:
            fn()
        self.assertIn(text, str(cm.exception))
        self.assertEqual(self.s._lib.calls, [], "the library was called despite bad input")

    def test_good_calls_reach_the_library(self):
        x, w, out = FakeTensor(64, 128), FakeTensor(256, 128), FakeTensor(128, 256)
        self.s.ag_gemm(x, w, out)
        self.s.ag_gemm(x, w, FakeTensor(128, 128), swiglu=True)
        self.s.gemm_rs(FakeTensor(128, 64), FakeTensor(96, 64), FakeTensor(64, 96), strategy="fused_ce")
        names = [c[0] for c in self.s._lib.calls]
        self.assertEqual(names, ["tessera_ag_gemm", "tessera_ag_gemm", "tessera_gemm_rs"])
        self.assertEqual(self.s._lib.calls[2][1][-1], self.tt.STRATEGIES["fused_ce"])

    def test_gemm_ar_shapes(self):
        self.s.gemm_ar(FakeTensor(128, 64), FakeTensor(96, 64), FakeTensor(128, 96), strategy="fused_ce")
        name, args = self.s._lib.calls[0]
        self.assertEqual(name, "tessera_gemm_ar")
        self.assertEqual(args[-1], self.tt.STRATEGIES["fused_ce"])
        self.s._lib.calls.clear()
        self.assert_rejected(lambda: self.s.gemm_ar(FakeTensor(128, 64), FakeTensor(96, 64), FakeTensor(64, 96)),
                             "gemm_ar: out is")

    def test_mlp_shapes(self):
        self.s.world = 2
        x, wgu, wd, out = FakeTensor(64, 128), FakeTensor(192, 128), FakeTensor(128, 96), FakeTensor(64, 128)
        self.s.mlp(x, wgu, wd, out)
        name, args = self.s._lib.calls[0]
        self.assertEqual(name, "tessera_mlp")
        self.assertEqual(args[5:9], (128, 64, 128, 96))  # m = rows × world, m_local, H, I_local
        self.s._lib.calls.clear()
        self.assert_rejected(lambda: self.s.mlp(x, FakeTensor(190, 128), wd, out), "w_gate_up")
        self.assert_rejected(lambda: self.s.mlp(x, wgu, FakeTensor(120, 96), out), "H = 128")
        self.assert_rejected(lambda: self.s.mlp(x, wgu, wd, FakeTensor(64, 96)), "token shard")

    def test_mismatched_k(self):
        self.assert_rejected(lambda: self.s.ag_gemm(FakeTensor(64, 120), FakeTensor(256, 128), FakeTensor(128, 256)),
                             "K = 120")
        self.assert_rejected(lambda: self.s.gemm_rs(FakeTensor(128, 64), FakeTensor(96, 72), FakeTensor(64, 96)),
                             "K = 72")

    def test_output_columns(self):
        self.assert_rejected(lambda: self.s.ag_gemm(FakeTensor(64, 128), FakeTensor(256, 128), FakeTensor(128, 256),
                                                    swiglu=True), "expected 128")
        self.assert_rejected(lambda: self.s.gemm_rs(FakeTensor(128, 64), FakeTensor(96, 64), FakeTensor(64, 80)),
                             "N = 96")

    def test_layout_device_dtype(self):
        w, out = FakeTensor(256, 128), FakeTensor(128, 256)
        self.assert_rejected(lambda: self.s.ag_gemm(FakeTensor(64, 128, contiguous=False), w, out), "contiguous")
        self.assert_rejected(lambda: self.s.ag_gemm(FakeTensor(64, 128, cuda=False), w, out), "CUDA")
        self.assert_rejected(lambda: self.s.ag_gemm(FakeTensor(64, 128, device=1), w, out), "cuda:1")
        self.assert_rejected(lambda: self.s.ag_gemm(FakeTensor(64, 128, dtype="f16"), w, out), "dtype mismatch")
        self.assert_rejected(lambda: self.s.ag_gemm(FakeTensor(64, 128, dtype="f32"), FakeTensor(256, 128, "f32"),
                                                    FakeTensor(128, 256, "f32")), "bf16 or fp16")

    def test_unknown_strategy(self):
        self.assert_rejected(lambda: self.s.gemm_rs(FakeTensor(128, 64), FakeTensor(96, 64), FakeTensor(64, 96),
                                                    strategy="magic"), "'magic'")


if __name__ == "__main__":
    unittest.main()
