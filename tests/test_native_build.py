"""ember.native builds on every x86-64 CPU (vec.h: 16-, 8- or 4-float vectors), warning-free, and a
build that fails leaves the numpy paths running with a message that says so.

The library is built with -march=native and without -Werror (a newer compiler's new warning must
not cost a user the kernels); here the sources are compiled with -Werror for x86-64 without AVX,
with AVX2 (-v3), with AVX-512 (-v4) and for this CPU, by gcc and clang where they are installed,
and a build for a CPU without AVX (EMBER_NATIVE_MARCH=x86-64: SSE2, 4-float vectors) is run
against this machine's library."""
from __future__ import annotations

import ctypes
import math
import os
import platform
import shutil
import subprocess

import numpy as np
import pytest

import ember.native as nat

X86 = platform.machine() in ("x86_64", "AMD64")
P, I64 = ctypes.c_void_p, ctypes.c_int64


def _compile_cmd(cc, march, out):
    wasm, simde = nat.wasm_sources()
    inc = ["-DEMBER_WASM_KERNELS", "-I", nat.SHIM, "-I", os.path.dirname(wasm[0]), "-idirafter", simde] if wasm else []
    flags = [f"-march={march}" if f == "-march=native" else f for f in nat.FLAGS]
    srcs = [os.path.join(nat.HERE, f) for f in nat.sources() if f.endswith(".c")]
    return [cc, *flags, "-Werror", '-DEMBER_NATIVE_HASH="0"', "-I", nat.HERE, *inc, *srcs, "-o", out, *nat.LIBS]


@pytest.mark.skipif(not X86, reason="x86-64 targets")
def test_sources_compile_without_warnings_for_every_x86_level(tmp_path):
    """gcc and clang (those installed), -Werror: x86-64 (SSE2, no AVX), -v3 (AVX2), -v4 (AVX-512)
    and native, built side by side."""
    ccs = [c for c in ("gcc", "clang") if shutil.which(c)]
    if not ccs:
        pytest.skip("no gcc or clang here")
    jobs = []
    for cc in ccs:
        for march in ("x86-64", "x86-64-v3", "x86-64-v4", "native"):
            out = str(tmp_path / f"{cc}-{march}.so")
            jobs.append(((cc, march), subprocess.Popen(_compile_cmd(cc, march, out), stdout=subprocess.PIPE,
                                                       stderr=subprocess.STDOUT, text=True)))
    failed = {}
    for key, proc in jobs:
        text = proc.communicate()[0]
        if proc.returncode:
            failed[key] = text[-3000:]
    assert not failed, failed


def _linear(lib, x, w, b, act):
    pack = lib.ember_linear_pack
    pack.restype, pack.argtypes = I64, [P, I64, I64, I64, P, I64]
    fn = lib.ember_linear
    fn.restype, fn.argtypes = I64, [P, P, P, P, P, P, P, P, P, P, I64, I64, I64]
    (m, k), n = x.shape, w.shape[0]
    need = pack(w.ctypes.data, n, k, k, None, 0)
    wp = np.empty(need, np.float32)
    pack(w.ctypes.data, n, k, k, wp.ctypes.data, need)
    y = np.empty((m, n), np.float32)
    g = np.array([m, k, n, k, n, n, act], np.int64)
    ap = np.zeros(5, np.float32)
    assert fn(x.ctypes.data, None, None, wp.ctypes.data, b.ctypes.data, None, y.ctypes.data, g.ctypes.data,
              ap.ctypes.data, None, 0, 0, m) == 0
    return y


def _gelu(lib, x):
    y = np.empty_like(x)
    lib.ember_gelu_erf(I64(x.size), P(x.ctypes.data), P(y.ctypes.data))
    return y


def _conv_pad(lib, x, w, b):
    """ember_conv_pad through numpy_nn's packing: 3x3, padding 1, relu, 2x2 pooling."""
    from ember.backends import numpy_nn
    fn = lib.ember_conv_pad
    fn.restype, fn.argtypes = I64, [P, P, P, P, P, P, P, I64, I64, I64]
    n, c, h, wd = x.shape
    o = w.shape[0]
    wp = numpy_nn._pack_dense(w)
    g = np.array([n, c, h, wd, c * h * wd, h * wd, wd, 1, o, h, wd, 3, 3, 1, 1, 1, 1, 1, 2], np.int64)
    ap = np.array([0, 0, 0, np.inf], np.float32)
    y = np.empty((n, o, h // 2, wd // 2), np.float32)
    sc = np.empty(1 << 16, np.float32)
    assert fn(wp.ctypes.data, x.ctypes.data, b.ctypes.data, y.ctypes.data, g.ctypes.data, ap.ctypes.data,
              sc.ctypes.data, sc.size, 0, n * (h // 2)) == 0
    return y


@pytest.mark.skipif(not X86, reason="x86-64 targets")
def test_build_for_a_cpu_without_avx_runs(tmp_path, monkeypatch):
    """EMBER_NATIVE_MARCH=x86-64 builds (4-float vectors, no FMA instruction) and its kernels give
    this machine's library's results within float32 rounding (GELU: the same bits, its fused
    multiply-adds exact either way)."""
    if nat.find_compiler() is None or nat.lib() is None:
        pytest.skip(f"no compiler or no library here: {nat.info()['reason']}")
    monkeypatch.setenv(nat.MARCH_ENV, "x86-64")
    assert "-march=x86-64" in nat.flags() and "-march=native" not in nat.flags()
    out = nat.build(out=str(tmp_path / "sse2.so"))
    monkeypatch.delenv(nat.MARCH_ENV)
    sse2, here = ctypes.CDLL(out), nat.lib()
    rng = np.random.default_rng(3)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((19, 37), (45, 37), (45,)))
    w /= math.sqrt(37)
    for act in (0, 4, 5):
        np.testing.assert_allclose(_linear(sse2, x, w, b, act), _linear(here, x, w, b, act), rtol=1e-5, atol=1e-5)
    g = rng.standard_normal(1000).astype(np.float32) * 3
    np.testing.assert_array_equal(_gelu(sse2, g), _gelu(here, g))
    xc, wc, bc = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 14, 13), (10, 3, 3, 3), (10,)))
    np.testing.assert_allclose(_conv_pad(sse2, xc, wc, bc), _conv_pad(here, xc, wc, bc), rtol=1e-5, atol=1e-5)


def test_failed_build_reason(tmp_path, monkeypatch):
    """A compiler that fails: build() raises with its message, and the library is not used; the
    reason names the failed build (not a stale library), until a build succeeds."""
    bad = tmp_path / "cc"
    bad.write_text("#!/bin/sh\necho 'x.c:1:1: error: no such intrinsic' >&2\nexit 1\n")
    bad.chmod(0o755)
    lib = str(tmp_path / "_ember_native-test.so")
    monkeypatch.setattr(nat, "lib_path", lambda: lib)
    saved = dict(nat._state)
    try:
        with pytest.raises(nat.DeviceError, match="no such intrinsic"):
            nat.build(cc=str(bad))
        assert os.path.exists(nat.error_path()) and not os.path.exists(lib)
        dll, reason = nat._load()
        assert dll is None and reason.startswith("its build failed for these sources (x.c:1:1: error: no such"), \
            reason
        if nat.find_compiler() is not None:
            nat.build()                                     # (a good build: the note goes)
            assert not os.path.exists(nat.error_path())
            assert nat._load()[1] == "loaded"
    finally:
        nat._state.clear()
        nat._state.update(saved)
