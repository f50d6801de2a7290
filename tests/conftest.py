"""Shared fixtures. Every op test takes the ``device`` fixture and so runs once per backend:
``python`` always, ``numpy`` where numpy is installed, ``webgpu`` where a GPU adapter exists
(lavapipe in CI), ``wasm`` where the kernel module is built and ``wasmtime`` is installed (the
SIMD module run on copies in CPython; inside Pyodide tests/test_pyodide.py runs it zero-copy).
``EMBER_TEST_DEVICES=python,numpy`` narrows the set."""
import gc
import os
import tempfile

import pytest

# Mesa (lavapipe) warns without a private runtime dir.
if not os.environ.get("XDG_RUNTIME_DIR"):
    _d = tempfile.mkdtemp(prefix="ember-xdg-")
    os.chmod(_d, 0o700)
    os.environ["XDG_RUNTIME_DIR"] = _d

# WebGPU autotune benchmarks every matmul/conv variant on the first call of each shape class: on
# lavapipe with a fresh cache (CI) that was most of a webgpu test's time (ocr_rec's first eager
# run: 564 of 610 s). Tests use the default variant; each variant is checked against numpy with
# autotune.force and autotune itself is tested with it switched on (tests/test_webgpu.py).
# Set before ember is imported (the module reads it once); EMBER_AUTOTUNE=on turns it back on.
os.environ.setdefault("EMBER_AUTOTUNE", "off")

ALL_DEVICES = ("python", "numpy", "webgpu", "wasm")


def pytest_collection_finish(session):
    """Move everything collection made (~580k objects for the whole suite: the test items,
    their op cases) out of the garbage collector's reach. ember calls ``gc.collect()`` itself
    (webgpu/replay.py on every plan recording, core/llm between replies), and a full
    collection walks every tracked object: ~0.3 s each after the whole suite's collection,
    which made tests/test_compile.py's 2,672 webgpu cases most of the suite's time. Frozen
    objects are never collected, so only what exists now (garbage collected first) is
    exempt; everything a test makes is collected as before."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """The same after each test file (its module fixtures torn down): what earlier files left
    alive (module globals, loaded models, ember's caches) is frozen too, so a collection in a
    later file walks only that file's objects (~60k objects, 18 ms a collection, by the time
    tests/test_compile.py runs). Garbage is collected first; only live objects are frozen."""
    yield
    if nextitem is None or nextitem.path != item.path:
        gc.collect()
        gc.freeze()


def _wanted():
    env = os.environ.get("EMBER_TEST_DEVICES")
    return tuple(d for d in env.split(",") if d) if env else ALL_DEVICES


def _skip_reason(name):
    import ember
    from ember.errors import DeviceError

    try:
        ember.get_backend(name)
    except DeviceError as e:
        return str(e)
    return None


def webgpu_only():
    """``(reason, mark)`` for a test file whose every test needs the webgpu backend: ``reason``
    says why that backend cannot exist on this machine (no WebGPU adapter, wgpu not installed),
    None where it can; ``mark``, the file's ``pytestmark``, skips each of its tests with that
    reason. The file imports ember.webgpu's modules only where ``reason`` is None::

        _REASON, pytestmark = webgpu_only()
        if _REASON is None:
            import ember.webgpu as wg
    """
    reason = _skip_reason("webgpu")
    return reason, pytest.mark.skipif(reason is not None, reason=f"webgpu unavailable: {reason}")


def rand(*shape, seed=0):
    """float32 standard-normal values of ``shape``, the same for the same ``seed`` (numpy)."""
    import numpy as np

    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def gpu(a):
    """The array-like ``a`` as a tensor on the webgpu device (through numpy)."""
    import numpy as np

    import ember

    return ember.from_numpy(np.asarray(a), device="webgpu")


def available(*names) -> list:
    """The devices among ``names`` whose backend exists on this machine, for parametrize lists
    that pair devices with cases (``from conftest import available``)."""
    return [n for n in names if _skip_reason(n) is None]


@pytest.fixture(params=_wanted())
def device(request):
    """The device name an op test runs on; skips only where that backend cannot exist here."""
    reason = _skip_reason(request.param)
    if reason:
        pytest.skip(f"{request.param} backend unavailable on this machine: {reason}")
    return request.param


@pytest.fixture
def rt():
    """The WebGPU runtime (tests of webgpu internals); skips only where no adapter can exist here."""
    reason = _skip_reason("webgpu")
    if reason:
        pytest.skip(f"webgpu backend unavailable on this machine: {reason}")
    from ember.webgpu.runtime import get_runtime

    return get_runtime()


@pytest.fixture
def kernels(monkeypatch):
    """The names of the kernels the webgpu runtime builds pipelines for (``rt.kernel``) during a
    test, in order."""
    from ember.webgpu.runtime import get_runtime

    rt = get_runtime()
    names = []
    orig = rt.kernel

    def kernel(name, *a, **kw):
        names.append(name)
        return orig(name, *a, **kw)

    monkeypatch.setattr(rt, "kernel", kernel)
    return names
