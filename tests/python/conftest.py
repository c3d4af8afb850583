"""pytest setup for tests/python: the source checkout's python/ on sys.path (unless the `tessera` package is
installed), and the stub-torch unittest (test_tessera_torch.py, run by ctest as a script) kept out of pytest's
process, where its stub would replace the real torch."""
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if os.environ.get("TESSERA_TEST_INSTALLED", "0") != "1":
    sys.path.insert(0, os.path.join(_ROOT, "python"))

collect_ignore = ["test_tessera_torch.py", "run_pytest.py"]
if "LOCAL_RANK" not in os.environ:
    collect_ignore.append("gpu")  # torchrun only (scripts/device-check.sh step python)
