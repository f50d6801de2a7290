"""ember inside Pyodide: small helpers for code that runs in the page.

The JS side lives next to this file: ``ember.js`` (the loader a page imports from
``/wasm/ember.js``; it boots Pyodide from the site's files and installs the ember wheel offline)
and ``run_pyodide.mjs`` (runs Python inside Pyodide under Node; the test suite uses it).

>>> from ember.wasm import is_pyodide
>>> is_pyodide()
False
"""
from __future__ import annotations

import sys
from typing import Callable, Optional

__all__ = ["is_pyodide", "fetch_bytes", "init", "boot_info"]

# How this Python started; /wasm/ember.js fills it in after its boot (snapshot.js).
_BOOT: dict = {"snapshot": False,
               "snapshot_note": "not started by /wasm/ember.js (Node, CPython or another loader): "
                                "no memory snapshot"}


def boot_info() -> dict:
    """How this interpreter started: ``{"snapshot": bool, "snapshot_note": str}``.

    In a page that loaded ember through ``/wasm/ember.js``, ``snapshot`` is True when Pyodide
    was restored from a memory snapshot taken after ``import ember`` (a revisit), and the note
    says why not otherwise (none stored yet, stale, corrupt, snapshots off, no Cache API...).

    >>> boot_info()["snapshot"]
    False
    """
    return dict(_BOOT)


async def init(*, wait_threads: float = 0.0) -> dict:
    """Set up ``device="wasm"`` (the WebAssembly SIMD kernels) and return what it runs on.

    Inside Pyodide this compiles the kernel module asynchronously and instantiates it on
    Pyodide's own memory: call it once on a page's main thread, where Chromium refuses
    synchronous compilation of modules over 4 KB. In Node, in a Worker and in CPython (with the
    ``wasmtime`` package) plain use of ``device="wasm"`` sets itself up, so this is optional
    there. Raises DeviceError saying why when the device cannot run here.

    Where threads are possible (a cross-origin isolated page, Node) it also starts the thread
    team for replayed plans (``set_threads``) in the background and returns at once;
    ``wait_threads`` > 0 waits up to that many seconds for it and all its workers.

    >>> import asyncio
    >>> asyncio.run(init())["device"]     # doctest: +SKIP
    'wasm'
    """
    from ..backends import get_backend, reset_backend
    from .runtime import init_async
    from .team import init_async as threads_init

    rt = await init_async()
    reset_backend("wasm")
    b = get_backend("wasm")
    await threads_init(wait_threads)
    return {"device": "wasm", "runtime": rt.kind, "kernels": sorted(b.native), **_module_info(),
            **_threads_info()}


def set_threads(n: Optional[int]) -> None:
    """Use ``n`` threads (the calling one plus ``n - 1`` workers) for replayed plans on device
    "wasm"; ``None``: the default, the browser's ``navigator.hardwareConcurrency`` (Node: its
    available cores) capped at 8. Where threads are unavailable (a page without cross-origin
    isolation, CPython) this is remembered and everything still runs on one thread
    (``info()["note"]`` says why). Results are the same bits for any thread count. Workers start
    in the background (``await ember.wasm.init(wait_threads=10)`` waits for them); plans move
    to the team on their next replay, those too small for it stay on one thread.

    >>> import ember
    >>> ember.wasm.set_threads(2)
    >>> ember.wasm.threads() >= 1
    True
    >>> ember.wasm.set_threads(None)
    """
    from .team import set_threads as _set

    _set(n)


def threads() -> int:
    """How many threads a replayed plan on device "wasm" runs on now (1 where threads are
    unavailable, or while the workers are still starting).

    >>> import ember
    >>> ember.wasm.threads() >= 1
    True
    """
    from .team import threads as _threads

    return _threads()


def _module_info() -> dict:
    """``module`` (the kernel module file that runs: kernels.wasm or kernels_relaxed.wasm),
    ``relaxed_simd`` and ``module_note`` (why that one)."""
    from ..errors import DeviceError
    from .runtime import select_module

    try:
        sel = select_module()
    except DeviceError as e:
        return {"module": None, "relaxed_simd": False, "module_note": str(e)}
    return {"module": sel["file"], "relaxed_simd": sel["relaxed"], "module_note": sel["why"]}


def _threads_info() -> dict:
    from .team import describe

    return describe()


def info() -> dict:
    """What device "wasm" runs on: ``runtime`` ("pyodide" or "wasmtime"), ``module`` (the kernel
    module: "kernels.wasm", plain SIMD, or "kernels_relaxed.wasm", relaxed SIMD), ``relaxed_simd``
    and ``module_note`` (why that module), ``threads`` (used now),
    ``threads_wanted``, ``max_threads`` (hardwareConcurrency / cores), ``shared_memory`` (whether
    a team of workers can exist here) and, when it runs on one thread, a ``note`` saying why;
    plus ``boot_info()``: ``snapshot`` (whether this Pyodide was restored from a memory snapshot)
    and ``snapshot_note``.

    >>> import ember
    >>> sorted(k for k in ember.wasm.info() if k in ("runtime", "threads"))   # doctest: +SKIP
    ['runtime', 'threads']
    """
    from .runtime import _runtime

    rt = _runtime[0]
    out = {"runtime": rt.kind if rt is not None else ("pyodide" if is_pyodide() else "wasmtime")}
    out.update(_module_info())
    out.update(_threads_info())
    out.update(boot_info())
    return out


def is_pyodide() -> bool:
    """True when running inside Pyodide (browser or Node), False in CPython."""
    return sys.platform == "emscripten"


async def fetch_bytes(url: str, on_progress: Optional[Callable[[int, int], None]] = None) -> bytes:
    """Download `url` with the browser's ``fetch`` and return its bytes (Pyodide only).

    ``on_progress(loaded, total)`` is called as chunks arrive; ``total`` is 0 when the size is
    not known in advance (no Content-Length; or a gzip-encoded response from a server other
    than ember.web, which also sends X-Uncompressed-Length). Relative URLs resolve against the
    page. Raises OSError naming the URL and the HTTP status when the download fails.

    >>> import asyncio
    >>> asyncio.run(fetch_bytes("weights.safetensors"))  # doctest: +SKIP
    b'...'
    """
    if not is_pyodide():
        raise RuntimeError("ember.wasm.fetch_bytes runs inside Pyodide only; in CPython read the "
                           "file or use urllib")
    import js  # Pyodide's bridge to the page's globals

    resp = await js.fetch(url)
    if not resp.ok:
        raise OSError(f"download of {url} failed: HTTP {resp.status} {resp.statusText}")
    # Content-Length counts compressed bytes under gzip; ember.web then also sends the real size.
    encoded = (resp.headers.get("Content-Encoding") or "identity") != "identity"
    total = int(resp.headers.get("X-Uncompressed-Length" if encoded else "Content-Length") or 0)
    if on_progress is None or resp.body is None:
        data = (await resp.arrayBuffer()).to_bytes()
        if on_progress is not None:
            on_progress(len(data), len(data))
        return data
    reader = resp.body.getReader()
    parts = []
    loaded = 0
    on_progress(0, total)
    while True:
        chunk = await reader.read()
        if chunk.done:
            break
        part = chunk.value.to_bytes()  # one typed-array copy per chunk, never a Python list
        parts.append(part)
        loaded += len(part)
        on_progress(loaded, total)
    return b"".join(parts)
