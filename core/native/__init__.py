"""Native CPU kernels for the numpy backend: the C in this folder, compiled on the machine it runs on.

numpy runs every operation as its own pass over memory, so an op made of many small passes
(a depthwise convolution's taps, GELU's polynomial, a layer norm's statistics) costs many times
what one loop over the data would. The kernels here are those loops, for the numpy backend's
ops where numpy itself is the bottleneck; matrix products stay in numpy's BLAS.

- **Build**: ``build()`` compiles every ``*.c`` here into one shared library
  ``_ember_native-<machine>.so`` beside the sources, with the first C compiler found (``$CC``,
  ``cc``, ``gcc``, ``clang``) and ``-O3 -march=native``: code for the CPU that built it. It is a
  build output (git-ignored, never in the wheel); ``python build.py setup``, ``test`` and ``demo``
  build it when missing or stale, and print why when they cannot.
- **Load**: ``lib()`` loads it with ctypes on first use, and only when the hash compiled into it
  equals ``source_hash()`` (this folder's sources, the flags, this CPU's feature flags): a stale
  library is never called. ctypes releases the GIL during a call, so ``numpy_blas.parallel_for``
  can run kernels on two cores.
- **The wasm backend's kernels** for quantized weights (``wasm/kernels/quant.c`` and the ``gemm.c``
  it calls) and the language-model ops (``llm.c``: rms_norm, rope, attention over a KV cache),
  written with wasm SIMD128 intrinsics, are compiled into the same library when SIMDe's header
  ``simde/wasm/simd128.h`` is found (Debian: ``libsimde-dev``): SIMDe runs those intrinsics on this
  CPU's vector unit. ``wasm_quant.c``, ``wasm_gemm.c`` and ``wasm_llm.c`` here include them with the
  shim of ``wasm_shim/`` and the renames of ``wasm_kernels.h`` (every name gets the prefix
  ``ember_wasm_``). Without SIMDe (or without the sources) they are left out,
  ``info()["wasm_kernels"]`` says why, and numpy_quant / numpy_llm run their numpy paths. The
  source hash covers those files and where SIMDe is.
- ``EMBER_NATIVE=require`` (benchmarks, CI): ``lib()`` raises DeviceError instead of falling back
  when the library is not in use (a stale build after a source edit is the usual reason).
- **Absent** (no compiler, Pyodide, ``EMBER_NATIVE=0``, a failed build): ``lib()`` is None and the
  numpy backend runs its numpy paths, the same results to rounding. ``info()`` says which and why
  (a failed build: its compiler's first error, kept in ``error_path()`` until a build succeeds).
- **Any x86-64 CPU** builds: the kernels' vectors are as wide as the target's registers (vec.h:
  AVX-512 16 floats, AVX 8, else 4), so a CPU without AVX gets SSE2 code, never a failed build.

>>> import ember.native as nat
>>> sorted(nat.info())
['available', 'compiler', 'path', 'reason', 'wasm_kernels']
>>> with nat.disabled():
...     nat.lib() is None
True
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading

from ..errors import DeviceError

HERE = os.path.dirname(os.path.abspath(__file__))
ENV = "EMBER_NATIVE"
# -fno-math-errno: sqrtf/expf inline (no errno to set); never -ffast-math: NaN and infinity
# keep their IEEE meaning and sums their written order. No -Werror here: a warning a newer
# compiler adds must not cost a user the kernels (tests/test_native_build.py compiles the sources
# with -Werror for x86-64 without AVX, with AVX2, with AVX-512 and -march=native, gcc and clang)
FLAGS = ["-O3", "-march=native", "-fPIC", "-shared", "-std=c11", "-fno-math-errno", "-fvisibility=hidden",
         "-Wall", "-Wno-unused-function"]
# EMBER_NATIVE_MARCH=x86-64 (or x86-64-v3, ...): a build for that target instead of this CPU's own
# (a library for older CPUs; the tests of a CPU without AVX). Part of the source hash.
MARCH_ENV = "EMBER_NATIVE_MARCH"


def flags() -> list:
    """FLAGS, with ``-march=$EMBER_NATIVE_MARCH`` where that is set."""
    march = os.environ.get(MARCH_ENV, "").strip()
    return [f"-march={march}" if f == "-march=native" and march else f for f in FLAGS]
LIBS = ["-lm"]

_lock = threading.Lock()
_state: dict = {}          # "lib": CDLL | None, "reason": str, "fns": {name: configured function}
class _Off(threading.local):
    """Per thread: whether ``disabled()`` switched the library off (False by default, so reading
    it never raises: ``lib()`` is on every native call's path)."""
    on = False


_off = _Off()


def sources() -> list:
    """The C sources and headers here, sorted by name (``source_hash`` covers them, ``wasm_shim/``
    and, when they are built, ``wasm_sources()``)."""
    return sorted(f for f in os.listdir(HERE) if f.endswith((".c", ".h")))


SHIM = os.path.join(HERE, "wasm_shim")
SIMDE_HEADER = os.path.join("simde", "wasm", "simd128.h")
SIMDE_DIRS = ("/usr/include", "/usr/local/include", "/opt/homebrew/include")
# what wasm_quant.c, wasm_gemm.c and wasm_llm.c compile from wasm/kernels/ (the sources and their headers)
WASM_FILES = ("quant.c", "gemm.c", "llm.c", "ember.h", "team.h", "linalg.h", "mathf.h")


def simde_dir() -> str | None:
    """The include folder holding SIMDe's ``simde/wasm/simd128.h`` (``$SIMDE_INCLUDE`` first), or None."""
    dirs = ([os.environ["SIMDE_INCLUDE"]] if os.environ.get("SIMDE_INCLUDE") else []) + list(SIMDE_DIRS)
    return next((d for d in dirs if os.path.isfile(os.path.join(d, SIMDE_HEADER))), None)


def wasm_kernels_dir() -> str | None:
    """``wasm/kernels`` (the package ``ember.wasm``'s), when every file of ``WASM_FILES`` is there."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("ember.wasm")
    except ImportError:
        return None
    for root in (spec.submodule_search_locations or []) if spec else []:
        d = os.path.join(root, "kernels")
        if all(os.path.isfile(os.path.join(d, f)) for f in WASM_FILES):
            return d
    return None


def wasm_sources() -> tuple:
    """(paths of the wasm kernel files the build compiles, SIMDe's include folder), or ((), why not)."""
    simde, kdir = simde_dir(), wasm_kernels_dir()
    if simde is None:
        return (), f"not built: SIMDe's {SIMDE_HEADER} not found (Debian: apt-get install libsimde-dev)"
    if kdir is None:
        return (), "not built: the wasm kernel sources (ember/wasm/kernels) are not installed"
    return tuple(os.path.join(kdir, f) for f in WASM_FILES), simde


def _cpu_id() -> str:
    """This CPU's architecture and feature flags: -march=native code is for these only."""
    ident = platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return ident + ":" + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ident + ":" + platform.processor()


def source_hash() -> str:
    """SHA-256 over the sources, the compile flags and this CPU's features."""
    h = hashlib.sha256()
    files = [os.path.join(HERE, name) for name in sources()]
    files += [os.path.join(SHIM, name) for name in sorted(os.listdir(SHIM))]
    wasm, simde = wasm_sources()
    if wasm:   # the sources compiled and SIMDe's header (its version); else only that they are absent
        files += [*wasm, os.path.join(simde, SIMDE_HEADER)]
    for path in files:
        h.update(os.path.basename(path).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(f.read() + b"\0")
    h.update(f"wasm kernels: {bool(wasm)}\0".encode())
    h.update(" ".join(flags() + LIBS).encode() + b"\0" + _cpu_id().encode())
    return h.hexdigest()


def lib_path() -> str:
    """Where the built library lives (beside the sources)."""
    ext = ".dylib" if sys.platform == "darwin" else ".dll" if os.name == "nt" else ".so"
    return os.path.join(HERE, f"_ember_native-{platform.machine() or 'cpu'}{ext}")


def error_path() -> str:
    """Where a failed build leaves the source hash it was for and the compiler's message (beside
    the library; removed by the next successful build): ``info()["reason"]`` then says so."""
    return os.path.splitext(lib_path())[0] + ".build-error"


def _build_error() -> str | None:
    """The compiler's message of the last build, where it failed for these sources on this CPU."""
    try:
        with open(error_path(), encoding="utf-8", errors="replace") as f:
            head, _, msg = f.read().partition("\n")
    except OSError:
        return None
    return msg if head == source_hash() else None


def find_compiler() -> str | None:
    """The C compiler ``build`` uses: ``$CC``, else the first of cc, gcc, clang on PATH."""
    for name in ([os.environ["CC"]] if os.environ.get("CC") else []) + ["cc", "gcc", "clang"]:
        path = shutil.which(name)
        if path:
            return path
    return None


TAG = b"ember-native-hash:"


def _built_hash(path: str) -> str | None:
    """The source hash a library was built from, read from the file (not loaded: a process
    keeps the first library it loaded from a path)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    at = data.find(TAG)
    return data[at + len(TAG):at + len(TAG) + 64].decode("ascii", "replace") if at >= 0 else None


def up_to_date(path: str | None = None) -> bool:
    """Whether the library at ``path`` exists and was built from these sources for this CPU."""
    path = path or lib_path()
    return os.path.exists(path) and _built_hash(path) == source_hash()


def build(out: str | None = None, cc: str | None = None) -> str:
    """Compile the kernels into ``out`` (default ``lib_path()``); return its path.

    Raises DeviceError (with the compiler's message) when there is no compiler or it fails. The
    library is written to a temporary file and moved into place, so a process that has the old
    one loaded keeps it."""
    cc = cc or find_compiler()
    if cc is None:
        raise DeviceError("native kernels: no C compiler (set CC, or install gcc or clang)")
    out = out or lib_path()
    srcs = [os.path.join(HERE, f) for f in sources() if f.endswith(".c")]
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(out))
    os.close(fd)
    wasm, simde = wasm_sources()
    inc = ["-DEMBER_WASM_KERNELS", "-I", SHIM, "-I", os.path.dirname(wasm[0]), "-idirafter", simde] if wasm else []
    cmd = [cc, *flags(), f'-DEMBER_NATIVE_HASH="{source_hash()}"', "-I", HERE, *inc, *srcs, "-o", tmp, *LIBS]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            msg = f"{os.path.basename(cc)} failed (exit {r.returncode}):\n{(r.stderr or r.stdout)[-4000:]}"
            if out == lib_path():
                _note_error(msg)
            raise DeviceError(f"native kernels: {msg}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    if out == lib_path() and os.path.exists(error_path()):
        os.unlink(error_path())
    with _lock:
        _state.clear()
    return out


def _note_error(msg: str) -> None:
    try:
        with open(error_path(), "w", encoding="utf-8") as f:
            f.write(source_hash() + "\n" + msg)
    except OSError:
        pass


def _load():
    if sys.platform == "emscripten":
        return None, "not on this platform (Pyodide: the page runs the WebAssembly kernels)"
    if os.environ.get(ENV, "").strip().lower() in ("0", "off", "no", "false"):
        return None, f"{ENV}=0"
    path = lib_path()
    if not up_to_date(path):
        err = _build_error()
        if err is not None:
            first = next((ln.strip() for ln in err.splitlines()[1:] if "error" in ln), err.splitlines()[0])
            return None, (f"its build failed for these sources ({first[:200]}): the numpy paths run "
                          f"(python -m ember.native shows the compiler's message)")
    if not os.path.exists(path):
        return None, f"not built ({os.path.basename(path)} missing: python build.py setup builds it)"
    if _built_hash(path) != source_hash():
        return None, "stale (built from other sources or for another CPU: python build.py setup rebuilds it)"
    try:
        dll = ctypes.CDLL(path)
        fn = dll.ember_native_hash
        fn.restype = ctypes.c_char_p
        if fn().decode() != source_hash():
            return None, "stale (this process had loaded an older build of it)"
    except (OSError, AttributeError) as exc:
        return None, f"cannot load {os.path.basename(path)}: {exc}"
    return dll, "loaded"


def lib():
    """The loaded library (a ctypes CDLL), or None where the numpy paths run (see ``info``)."""
    if _off.on:
        return None
    st = _state
    if "lib" not in st:
        with _lock:
            if "lib" not in st:
                st["fns"] = {}
                st["lib"], st["reason"] = _load()
                st["require"] = os.environ.get(ENV, "").strip().lower() == "require"
    if st["lib"] is None and st["require"]:
        raise DeviceError(f"native kernels required ({ENV}=require) but not in use: {st['reason']}")
    return st["lib"]


def kernel(name: str, restype, *argtypes):
    """The library's function ``name`` with this ctypes signature (cached per signature: two
    callers may declare one symbol differently without changing each other's), or None when the
    library is not in use or was built without it (the ``ember_wasm_`` kernels without SIMDe).
    Pointers are passed as ``ctypes.c_void_p`` (``array.ctypes.data``)."""
    dll = lib()
    if dll is None:
        return None
    fns = _state["fns"]
    key = (name, restype, argtypes)
    fn = fns.get(key)
    if fn is None:
        try:
            fn = dll[name]          # a new function object each time (getattr would share one)
        except AttributeError:
            return None
        fn.restype = restype
        fn.argtypes = argtypes
        fns[key] = fn
    return fn


@contextlib.contextmanager
def disabled():
    """Within this block (on this thread) ``lib()`` is None: the numpy paths run (tests compare)."""
    prev = _off.on
    _off.on = True
    try:
        yield
    finally:
        _off.on = prev


def info() -> dict:
    """Whether the native kernels run here, the library's path, the compiler a build would use,
    the reason when they do not, and whether the wasm backend's quantized kernels are in it (or why not)."""
    dll = lib()
    wasm, simde = wasm_sources()
    if dll is not None:
        wasm_state = ("built (SIMDe in {})".format(simde) if getattr(dll, "ember_wasm_q_linear", None)
                      else "not built" if wasm else simde)
    else:
        wasm_state = f"not in use (the library is not); a build would: {'include them' if wasm else simde}"
    return {"available": dll is not None, "path": lib_path(), "compiler": find_compiler(),
            "reason": "disabled on this thread" if _off.on else _state.get("reason", ""),
            "wasm_kernels": wasm_state}
