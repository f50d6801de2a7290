"""ember makes no noise of its own: native WebGPU starts without wgpu's "Forcing backend"
warning or Mesa's XDG_RUNTIME_DIR complaint (users see stderr; tests used to hide it)."""
import os
import subprocess
import sys

import pytest

import ember
from ember.errors import DeviceError


def test_native_webgpu_prints_nothing():
    try:
        ember.get_backend("webgpu")
    except DeviceError as e:
        pytest.skip(f"webgpu backend unavailable on this machine: {e}")
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "WGPU_BACKEND_TYPE")}
    code = "import ember; print((ember.ones((3,), device='webgpu') * 2).tolist())"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[2.0, 2.0, 2.0]"
    assert proc.stderr == "", proc.stderr
