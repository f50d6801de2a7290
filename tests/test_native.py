"""ember.native: the numpy backend's C kernels, built on this machine (loader, staleness, switches).

The kernels themselves are tested where the numpy backend uses them, against float64 references,
with the library on and off (``ember.native.disabled()``)."""
import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

import ember.native as nat


def test_library_is_built_where_a_compiler_exists():
    if nat.find_compiler() is None:
        pytest.skip("no C compiler on this machine (build.py installs clang on Debian): the numpy paths run")
    assert nat.lib() is not None, nat.info()["reason"]
    assert nat.info()["available"] and nat.info()["reason"] == "loaded"
    assert nat.up_to_date()


def test_smoke_kernel_and_disabled():
    f = nat.kernel("ember_native_axpy", None, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p)
    if f is None:
        pytest.skip(nat.info()["reason"])
    x = np.arange(5, dtype=np.float32)
    y = np.ones(5, np.float32)
    f(5, 2.0, x.ctypes.data, y.ctypes.data)
    assert y.tolist() == [1.0, 3.0, 5.0, 7.0, 9.0]
    with nat.disabled():
        assert nat.lib() is None and nat.kernel("ember_native_axpy", None) is None
        assert nat.info()["reason"] == "disabled on this thread"
    assert nat.lib() is not None


def test_stale_library_is_never_loaded(tmp_path):
    if nat.find_compiler() is None:
        pytest.skip("no C compiler on this machine")
    out = str(tmp_path / "lib.so")
    nat.build(out=out)
    assert nat.up_to_date(out)
    # another source hash compiled in: what a library built from older sources carries
    cmd = [nat.find_compiler(), *nat.FLAGS, '-DEMBER_NATIVE_HASH="0000"', "-I", nat.HERE,
           os.path.join(nat.HERE, "abi.c"), "-o", out]
    subprocess.run(cmd, check=True)
    assert not nat.up_to_date(out)


def test_env_switch_and_compiler_errors(tmp_path, monkeypatch):
    code = "import ember.native as n; i = n.info(); print(i['available'], i['reason'])"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, EMBER_NATIVE="0"))
    assert r.stdout.strip() == "False EMBER_NATIVE=0", r.stderr
    bad = tmp_path / "cc"
    bad.write_text("#!/bin/sh\necho 'cc: error: no such thing' >&2\nexit 3\n")
    bad.chmod(0o755)
    with pytest.raises(nat.DeviceError, match=r"(?s)failed \(exit 3\).*no such thing"):
        nat.build(out=str(tmp_path / "x.so"), cc=str(bad))
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    monkeypatch.delenv("CC", raising=False)
    assert nat.find_compiler() is None
    with pytest.raises(nat.DeviceError, match="no C compiler"):
        nat.build(out=str(tmp_path / "x.so"))


def test_require_raises_where_the_library_is_not_in_use(tmp_path):
    code = ("import ember.native as n\n"
            "try:\n    n.lib()\nexcept n.DeviceError as e:\n    print('raised', e)\nelse:\n    print('loaded')")
    env = dict(os.environ, EMBER_NATIVE="require")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.stdout.startswith("loaded" if nat.up_to_date() else "raised"), r.stderr
    # the same where the library is missing
    r = subprocess.run([sys.executable, "-c", code.replace("import ember.native as n",
                        "import ember.native as n; n.lib_path = lambda: '/nonexistent/lib.so'")],
                       capture_output=True, text=True, env=env)
    assert r.stdout.startswith("raised native kernels required (EMBER_NATIVE=require) but not in use: not built"), \
        r.stdout + r.stderr


def test_one_symbol_two_signatures():
    a = nat.kernel("ember_native_axpy", None, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p)
    if a is None:
        pytest.skip(nat.info()["reason"])
    b = nat.kernel("ember_native_axpy", ctypes.c_int64)      # a probe without argument types
    assert a is not b and a.argtypes and not b.argtypes
    assert nat.kernel("ember_native_axpy", None, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p,
                      ctypes.c_void_p) is a
    assert nat.kernel("no_such_kernel", None) is None
