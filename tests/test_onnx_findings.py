"""Fuzzer findings against ember.onnx that are fixed: each reproducer (tests/fuzz/onnx_findings/)
now fails with an ember error, never a bare IndexError/ValueError/TypeError. Replayed through the
fuzz harness itself (a child process under a memory cap and a timeout)."""
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FINDINGS = os.path.join(REPO, "tests", "fuzz", "onnx_findings")
FIXED = [
    "other-load_IndexError_core_onnx_fuse.py_124__fuse_gelu_.onnx",        # Erf without inputs
    "other-load_IndexError_core_onnx_fuse.py_197__fuse_linear_.onnx",      # MatMul + Add, input missing
    "other-load_ValueError_core_onnx_fuse.py_190__fuse_linear_.onnx",      # MatMul with 3 inputs
    "other-load_ValueError_core_onnx_proto.py_625___read_external_.onnx",  # NUL in a location
    "other-load_ValueError_core_onnx_proto.py_663__tensor_bytes_.onnx",    # 2^60+ elements
    "other-run_TypeError_core_onnx_runtime.py_365__run_handler_.onnx",     # too few node inputs
]


@pytest.mark.parametrize("name", FIXED)
def test_fixed_finding_gives_an_ember_error(name):
    path = os.path.join(FINDINGS, name)
    proc = subprocess.run([sys.executable, os.path.join(REPO, "tests", "fuzz", "fuzz.py"), "--replay", path],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    out = proc.stdout + proc.stderr
    assert ": fine (ember" in out, out[-2000:]
