"""The shipped WebAssembly kernel module: built from the committed sources, deterministic, and
within its memory-safety rules (no data, no globals, no stack, no table; only ``env.memory``
imported; functions exported only); and the runtime's bounds checks refuse every span that
would reach outside a buffer before any kernel runs."""
from __future__ import annotations

import importlib.resources
import os
import shutil
import sys
from array import array

import pytest

import ember
from ember.errors import BoundsError, DeviceError
from ember.wasm import build_kernels, wasmbin
from ember.wasm.runtime import R, W, check_span

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def shipped() -> bytes:
    try:
        return importlib.resources.files("ember.wasm").joinpath("kernels.wasm").read_bytes()
    except FileNotFoundError:
        pytest.fail("ember.wasm has no kernels.wasm: build it with 'python build.py wheel' "
                    "(wasm/build_kernels.py, needs clang and lld)", pytrace=False)


def test_module_follows_its_rules():
    data = shipped()
    assert wasmbin.check_kernel_module(data) == []
    m = wasmbin.parse(data)
    assert set(m.custom()) == {build_kernels.SECTION}
    assert not {4, 6, 8, 9, 11, 12} & set(m.ids()), m.ids()
    names = [name for name, kind, _ in m.exports()]
    assert len(names) >= 3 and len(set(names)) == len(names)


def test_module_is_built_from_the_committed_sources():
    assert build_kernels.embedded_hash(shipped()) == build_kernels.source_hash(), \
        "kernels.wasm was built from other sources: rebuild with 'python build.py wheel'"


@pytest.mark.skipif(build_kernels.find_clang() is None or shutil.which("wasm-ld") is None,
                    reason="clang/lld are not installed (python build.py setup installs them)")
def test_rebuild_from_sources_is_byte_identical(tmp_path):
    out = build_kernels.build(str(tmp_path / "k.wasm"))
    assert open(out, "rb").read() == shipped()


def test_checker_catches_what_clang_would_add():
    # A module with a (mutable i32) global, a data segment and an exported table: all refused.
    def sec(i, payload):
        return bytes([i]) + wasmbin.uleb(len(payload)) + payload
    imp = sec(2, b"\x01\x03env\x06memory\x02\x00\x01")
    glob = sec(6, b"\x01\x7f\x01\x41\x00\x0b")
    data = sec(11, b"\x01\x00\x41\x00\x0b\x01\x2a")
    bad = wasmbin.MAGIC + imp + glob + data
    problems = wasmbin.check_kernel_module(bad)
    assert any("global" in p for p in problems) and any("data" in p for p in problems), problems
    stripped = wasmbin.parse(wasmbin.strip_module(bad))
    assert 6 not in stripped.ids()
    with pytest.raises(wasmbin.WasmFormatError):
        wasmbin.parse(b"\0asm\x02\0\0\0")


def test_a_stripped_module_that_used_a_global_does_not_validate():
    wasmtime = pytest.importorskip("wasmtime")
    # (func (export "f") (result i32) global.get 0) with its global, then stripped.
    def sec(i, payload):
        return bytes([i]) + wasmbin.uleb(len(payload)) + payload
    module = (wasmbin.MAGIC + sec(1, b"\x01\x60\x00\x01\x7f") + sec(3, b"\x01\x00")
              + sec(6, b"\x01\x7f\x01\x41\x07\x0b") + sec(7, b"\x01\x01f\x00\x00")
              + sec(10, b"\x01\x04\x00\x23\x00\x0b"))
    wasmtime.Module(wasmtime.Engine(), module)   # valid with its global
    with pytest.raises(Exception, match="global"):
        wasmtime.Module(wasmtime.Engine(), wasmbin.strip_module(module))


@pytest.mark.parametrize("span", [
    W(array("f", [0.0] * 4), 5),           # too long
    R(array("f", [0.0] * 4), 2, 3),        # runs off the end from an offset
    R(array("f", [0.0] * 4), -1),          # negative length
    R(array("f", [0.0] * 4), 1, -1),       # negative offset
    R(array("f", [0.0] * 4), 2, 0, 2),     # pointer outside its span
    W(b"abcd", 1),                         # writing into immutable bytes
])
def test_bounds_checks_refuse_bad_spans(span):
    with pytest.raises(BoundsError):
        check_span(span)


def test_runtime_refuses_a_bad_call_before_running_it():
    try:
        rt = ember.get_backend("wasm").rt
    except DeviceError as e:
        pytest.skip(f"wasm backend unavailable on this machine: {e}")
    src = array("I", range(8))
    dst = array("I", [0] * 8)
    shape = array("i", [1, 1, 1, 1, 1, 8])
    strides = array("i", [0, 0, 0, 0, 0, 1])
    with pytest.raises(BoundsError):   # dst is one element short of what the kernel writes
        rt.call("copy_strided_x32", R(src, 8), W(array("I", [0] * 7), 8), R(shape, 6), R(strides, 6))
    rt.call("copy_strided_x32", R(src, 8), W(dst, 8), R(shape, 6), R(strides, 6))
    assert list(dst) == list(range(8))
