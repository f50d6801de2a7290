"""ember in a Web Worker (`loadEmber({worker: true})`, wasm/ember.js): the proxy API and its
message protocol, values both ways, Python errors with their traceback, progress, cancel through
an AbortSignal, JS modules next to Pyodide, the Cache API, WebGPU inside the worker (pipelines
created with createComputePipelineAsync), and a page thread that stays free while Python runs."""
from __future__ import annotations

import pytest

# A Python module the tests put into the worker's file system.
MOD = '''
import time
import ember_worker

def add(a, b):
    return a + b

def kinds(*args, **kwargs):
    return [type(a).__name__ for a in args] + [f"{k}={type(v).__name__}" for k, v in sorted(kwargs.items())]

def floats(view):
    return [view.format, list(view)]

def blob(n):
    return bytes(range(n))

def bad(n):
    raise ValueError(f"need a positive n, got {n}")

def unsendable():
    return object()

async def steps(n, spin_ms=20):
    for i in range(n):
        ember_worker.check_cancelled()
        t = time.perf_counter()
        while time.perf_counter() - t < spin_ms / 1000:   # Python holding the worker's thread
            pass
        ember_worker.progress((i + 1) / n, f"step {i + 1}", i=i + 1)
    return n

def in_task():
    # Whether this call runs as a task on Pyodide's event loop (it should not: a plain def is
    # called directly, no macrotask round per call).
    import asyncio
    try:
        return asyncio.current_task() is not None
    except RuntimeError:   # no running loop at all: not a task either
        return False

async def in_task_async():
    import asyncio
    return asyncio.current_task() is not None

def deferred(n):
    # A plain def returning a coroutine (as the MNIST page's predict does on WebGPU): awaited.
    ember_worker.progress(0.5, "sync part", i=n)
    return steps(n, 0)

def busy(ms):
    t = time.perf_counter()
    while time.perf_counter() - t < ms / 1000:
        pass
    return ms
'''

# A JS module the worker imports (callJs): runs next to Pyodide, with the worker's fetch.
JS_MOD = """
export async function sizes(ctx, url, path) {
  const { bytes, cached } = await ctx.fetch(url);
  ctx.progress(1, "fetched", { n: bytes.length });
  ctx.writeFile(path, bytes.subarray(0, 10));
  return { n: bytes.length, cached, py: ctx.pyodide.runPython(`len(open(${JSON.stringify(path)}, 'rb').read())`) };
}
"""


@pytest.fixture(scope="module")
def _booted_worker_page(module_page):
    """The site's index with an EmberWorker booted as window.ew and MOD importable as `mod`:
    one boot for the module's tests (each leaves the worker as it found it; the terminate test
    comes last)."""
    page = module_page
    page.goto("/")
    info = page.evaluate("""async (src) => {
        const { loadEmber } = await import("/wasm/ember.js");
        const progress = [];
        window.ew = await loadEmber({ worker: true, onProgress: (p) => progress.push([p.label, p.fraction]) });
        await window.ew.runPython(`import os, sys\\nos.makedirs("/home/pyodide/t", exist_ok=True)\\n` +
            `open("/home/pyodide/t/mod.py", "w").write(${JSON.stringify(src)})\\nsys.path.insert(0, "/home/pyodide/t")`);
        return { ...window.ew.info, progress };
    }""", MOD)
    page.ember_info = info
    return page


@pytest.fixture
def worker_page(_booted_worker_page, shared_page, request):
    yield from shared_page(request, _booted_worker_page)


def test_worker_boots_and_runs_python_off_the_page_thread(worker_page):
    page = worker_page
    info = page.ember_info
    assert info["worker"] is True and info["crossOriginIsolated"] is True and info["cancelFlags"] is True
    assert info["version"] and "python" in info["devices"]
    labels = [label for label, _ in info["progress"]]
    for want in ("Loading Python runtime", "Downloading ember", "Installing ember", "Ready"):
        assert want in labels, labels
    fractions = [f for _, f in info["progress"]]
    assert fractions == sorted(fractions) and fractions[-1] == 1
    # the start's steps, in ms since loadEmber (also performance marks "ember:<step>" in the worker)
    tm = info["timings"]
    order = ["boot", "pyodideImported", "pyodideReady", "wheelFetched", "installed", "emberImported", "wasmReady"]
    assert [tm[k] for k in order] == sorted(tm[k] for k in order), tm
    assert tm["boot"] < tm["manifest"] <= tm["pyodideReady"] and tm["asmCompiled"] > tm["boot"], tm
    # Pyodide is not on the page.
    assert page.evaluate("() => typeof window.pyodide === 'undefined' && typeof window.loadPyodide === 'undefined'")
    got = page.evaluate("""async () => [
        await ew.runPython("1 + 2"),
        await ew.runPythonAsync("import asyncio\\nawait asyncio.sleep(0)\\n{'a': [1, 2.5, 'x', None, True]}"),
        await ew.runPython("import sys\\nsys.platform"),
    ]""")
    assert got == [3, {"a": [1, 2.5, "x", None, True]}, "emscripten"]


def test_call_converts_values_both_ways(worker_page):
    got = worker_page.evaluate("""async () => {
        const px = new Float32Array([0.5, 1.5, -2]);
        const r = {
            add: await ew.call("mod", "add", [2, 3]),
            strs: await ew.call("mod", "add", ["a", "b"]),
            kinds: await ew.call("mod", "kinds", [new Float32Array(2), [1], { k: 1 }, "s", 1.5], { kwargs: { z: [1] } }),
            floats: await ew.call("mod", "floats", [px], { transfer: [px.buffer] }),
            transferred: px.byteLength,     // 0: the buffer moved to the worker, no copy
        };
        const b = await ew.call("mod", "blob", [5]);
        r.blob = [b.constructor.name, Array.from(b)];
        return r;
    }""")
    assert got == {"add": 5, "strs": "ab", "kinds": ["memoryview", "list", "dict", "str", "float", "z=list"],
                   "floats": ["f", [0.5, 1.5, -2.0]], "transferred": 0, "blob": ["Uint8Array", [0, 1, 2, 3, 4]]}


def test_plain_functions_are_called_without_an_event_loop_round(worker_page):
    got = worker_page.evaluate("""async () => {
        const seen = [];
        const ac = new AbortController();
        const r = {
            sync: await ew.call("mod", "in_task"),
            async: await ew.call("mod", "in_task_async"),
            // progress from the synchronous part and from the coroutine it returns, and two
            // such calls interleaved: each reports to its own onProgress
            both: await Promise.all([
                ew.call("mod", "deferred", [2], { onProgress: (p) => seen.push(["a", p.label]) }),
                ew.call("mod", "deferred", [1], { signal: ac.signal, onProgress: (p) => seen.push(["b", p.label]) }),
            ]),
        };
        r.seen = seen;
        return r;
    }""")
    assert got["sync"] is False and got["async"] is True
    assert got["both"] == [2, 1]
    assert sorted(got["seen"]) == sorted([["a", "sync part"], ["a", "step 1"], ["a", "step 2"],
                                          ["b", "sync part"], ["b", "step 1"]]), got["seen"]


def test_python_errors_carry_type_message_and_traceback(worker_page):
    got = worker_page.evaluate("""async () => {
        const out = [];
        for (const [fn, args] of [["bad", [-1]], ["unsendable", []], ["nope", []]]) {
            try { await ew.call("mod", fn, args); out.push("resolved"); }
            catch (e) { out.push({ name: e.name, message: e.message, type: e.pythonType, msg: e.pythonMessage,
                                   tb: e.traceback, isError: e instanceof Error }); }
        }
        try { await ew.runPython("import no_such_module"); } catch (e) { out.push({ type: e.pythonType, msg: e.pythonMessage }); }
        return out;
    }""")
    bad, unsendable, missing, imp = got
    assert bad["isError"] and bad["name"] == "PythonError" and bad["type"] == "ValueError"
    assert bad["message"] == "ValueError: need a positive n, got -1" and bad["msg"] == "need a positive n, got -1"
    assert "Traceback" in bad["tb"] and "mod.py" in bad["tb"] and 'in bad' in bad["tb"]
    assert "cannot be sent to the page" in unsendable["message"]
    assert missing["type"] == "AttributeError" and "nope" in missing["msg"]
    assert imp == {"type": "ModuleNotFoundError", "msg": "No module named 'no_such_module'"}


def test_progress_and_cancel_with_an_abort_signal(worker_page):
    got = worker_page.evaluate("""async () => {
        const seen = [];
        const n = await ew.call("mod", "steps", [3], { onProgress: (p) => seen.push([p.fraction, p.label, p.i]) });
        // Cancel a long call midway: Python sees the flag (a SharedArrayBuffer) while it runs.
        const ac = new AbortController();
        const steps = [];
        const p = ew.call("mod", "steps", [500, 20], { signal: ac.signal, onProgress: (x) => {
            steps.push(x.i);
            if (x.i === 5) ac.abort();
        } });
        const err = await p.then(() => null, (e) => ({ name: e.name, type: e.pythonType }));
        // Aborted before it is sent: rejected at once, nothing runs.
        const pre = new AbortController();
        pre.abort();
        const early = await ew.call("mod", "add", [1, 2], { signal: pre.signal }).then(() => null, (e) => e.name);
        // The slot is clean for the next call: it runs to the end.
        const again = await ew.call("mod", "steps", [2], { signal: new AbortController().signal });
        return { n, seen, err, last: steps[steps.length - 1], early, again };
    }""")
    assert got["n"] == 3 and got["seen"] == [[1 / 3, "step 1", 1], [2 / 3, "step 2", 2], [1, "step 3", 3]]
    assert got["err"] == {"name": "AbortError", "type": "Cancelled"}
    assert 5 <= got["last"] < 500, got          # stopped within a step or so of the abort
    assert got["early"] == "AbortError" and got["again"] == 2


def test_page_thread_stays_free_while_python_computes(worker_page, long_tasks):
    page = worker_page
    before = len(long_tasks(page))
    frames = page.evaluate("""async () => {
        let frames = 0, stop = false;
        const tick = () => { frames++; if (!stop) requestAnimationFrame(tick); };
        requestAnimationFrame(tick);
        const t0 = performance.now();
        await ew.call("mod", "busy", [1500]);       // 1.5 s of Python holding the worker's thread
        stop = true;
        return { frames, ms: performance.now() - t0 };
    }""")
    assert frames["ms"] >= 1500
    # Headless Chromium paints at ~60 Hz when idle; a blocked thread would give one frame or none.
    assert frames["frames"] > 20, frames
    over = [t for t in long_tasks(page)[before:] if t["duration"] > 100]
    assert not over, over


def test_callJs_fetchFile_and_the_cache(worker_page, request_log, site_dir):
    import json

    page = worker_page
    manifest = json.loads((site_dir / "manifest.json").read_text())
    path = "demos/mnist/mnist.safetensors"
    size = (site_dir / path).stat().st_size
    request_log.clear()
    got = page.evaluate("""async ([path, jsSource]) => {
        const a = await ew.fetchFile("/" + path, "/tmp/w.bin");
        const b = await ew.fetchFile("/" + path, "/tmp/w.bin");
        const n = await ew.runPython("import os\\nos.path.getsize('/tmp/w.bin')");
        const seen = [];
        const mod = URL.createObjectURL(new Blob([jsSource], { type: "text/javascript" }));
        const js = await ew.callJs(mod, "sizes", ["/" + path, "/tmp/ten.bin"], { onProgress: (p) => seen.push(p.n) });
        const keys = (await (await caches.open("ember-assets")).keys()).map((r) => new URL(r.url).pathname + new URL(r.url).search);
        return { a, b, n, js, seen, keys };
    }""", [path, JS_MOD])
    v = manifest["files"][path]
    assert got["a"] == {"bytes": size, "cached": False} and got["b"] == {"bytes": size, "cached": True}
    assert got["n"] == size
    assert got["js"] == {"n": size, "cached": True, "py": 10} and got["seen"] == [size]
    assert f"/{path}?v={v}" in got["keys"]
    assert any(k.startswith("/" + manifest["wheel"] + "?v=") for k in got["keys"])
    # One download in all: the two later reads came from the Cache API.
    assert [r for r in request_log if r.startswith("/" + path)] == [f"/{path}?v={v}"]


def test_webgpu_in_the_worker_creates_pipelines_asynchronously(worker_page):
    got = worker_page.evaluate("""async () => {
        const r = await ew.initWebGPU();
        if (!r.ok) return { webgpu: r };
        return { webgpu: r, info: ew.info.webgpu, out: await ew.runPythonAsync(`
import ember, ember.webgpu
from ember.errors import DeviceError
from ember.webgpu.runtime import get_runtime

a = ember.tensor([[1.0, 2.0], [3.0, 4.0]], device="webgpu")
y = (ember.matmul(a, a) * 2.0).tolist()
drv = get_runtime().driver
# WGSL that compiles but has no entry point "missing": creating the pipeline fails, and with
# createComputePipelineAsync it fails right here, naming the entry point.
src = "@group(0) @binding(0) var<storage, read_write> x: array<f32>;\\\\n@compute @workgroup_size(1) fn main() { x[0] = 1.0; }"
try:
    drv.pipeline(src, "missing")
    err = None
except DeviceError as e:
    err = str(e)
ok = drv.pipeline(src, "main") is not None
import js
adapter = await js.navigator.gpu.requestAdapter()
fallback = bool(getattr(adapter.info, "isFallbackAdapter", False) or getattr(adapter, "isFallbackAdapter", False))
[y, err, ok, ember.webgpu.stats()["pipelines_compiled"] > 0, [ember.webgpu.info()["adapter_type"], fallback]]
`) };
    }""")
    assert got["webgpu"]["ok"], got["webgpu"]
    assert got["info"] is True
    y, err, ok, compiled, (adapter_type, fallback) = got["out"]
    # A software adapter (SwiftShader here) is reported as such: the demos say so to the user.
    assert adapter_type == ("fallback" if fallback else ""), (adapter_type, fallback)
    assert y == [[14.0, 20.0], [30.0, 44.0]]
    assert err and "'missing'" in err and "could not be created" in err, err
    assert ok and compiled


def test_terminate_rejects_pending_calls_and_a_new_worker_starts(worker_page):
    # The last test on the shared worker page: it terminates window.ew.
    got = worker_page.evaluate("""async () => {
        const { loadEmber } = await import("/wasm/ember.js");
        const same = (await loadEmber({ worker: true })) === ew;      // one worker per page...
        const pending = ew.call("mod", "busy", [5000]);
        await new Promise((r) => setTimeout(r, 100));
        ew.terminate();
        const err = await pending.then(() => null, (e) => e.name);
        const fresh = await loadEmber({ worker: true });               // ...until it is terminated
        return { same, err, fresh: fresh !== ew, works: await fresh.runPython("6 * 7") };
    }""")
    assert got == {"same": True, "err": "AbortError", "fresh": True, "works": 42}


def test_the_cache_keeps_one_version_per_file(page, request_log):
    # fetchBytes({cache: true}) answers from the Cache API and drops older versions of a path.
    page.goto("/")
    request_log.clear()
    got = page.evaluate("""async () => {
        const { fetchBytes } = await import("/wasm/ember.js");
        const seen = [];
        const a = await fetchBytes("/manifest.json?v=one", { cache: true });
        const b = await fetchBytes("/manifest.json?v=one", { cache: true, onProgress: (p) => seen.push(p.cached) });
        await fetchBytes("/manifest.json?v=two", { cache: true });
        const keys = (await (await caches.open("ember-assets")).keys()).map((r) => new URL(r.url).search);
        return { same: a.length === b.length && a.length > 0, seen, keys };
    }""")
    assert got == {"same": True, "seen": [True], "keys": ["?v=two"]}
    assert [r for r in request_log if r.startswith("/manifest.json?")] == ["/manifest.json?v=one", "/manifest.json?v=two"]
