"""The Python half of bench.js for ember: runs inside Pyodide in the bench page.

``await setup(model, device)`` loads the model's code (the demo's own ``model.py``, fetched from
the site) and its weights onto ``device``; ``run(name)`` runs one workload of
``/cache/inputs.json`` (the inputs onnxruntime-web gets too) and returns the output as a flat
list of floats (a coroutine on "webgpu" only: bench.js awaits either). The backend "wasm" is
set up with ``await ember.wasm.init()``; where this wheel has no such backend, ``setup`` raises
``BenchUnavailable`` with the reason and the page reports the column as n/a.
"""
from __future__ import annotations

import importlib.util
import inspect
import json
import sys
import time
from array import array

import ember
import ember.wasm

_state: dict = {}


class BenchUnavailable(RuntimeError):
    """This backend does not exist (or does not start) in this wheel / browser."""


def _ms() -> float:
    return time.perf_counter() * 1000


async def _init_device(device: str) -> None:
    if device == "wasm":
        init = getattr(ember.wasm, "init", None)
        if init is None:
            raise BenchUnavailable("this wheel's ember.wasm has no init(): the WebAssembly SIMD "
                                   "backend has not landed yet")
        try:
            r = init()
            if inspect.isawaitable(r):
                await r
        except Exception as e:
            raise BenchUnavailable(f"ember.wasm.init() failed: {type(e).__name__}: {e}") from e
    if device not in ember.devices():
        raise BenchUnavailable(f"ember.devices() = {ember.devices()} has no {device!r}")


async def _module(model: str):
    src = (await ember.wasm.fetch_bytes(f"/demos/{model}/model.py")).decode()
    name = f"bench_{model}_model"
    spec = importlib.util.spec_from_loader(name, loader=None, origin=f"/demos/{model}/model.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    exec(compile(src, f"demos/{model}/model.py", "exec"), mod.__dict__)
    return mod


async def _set_threads(threads: int) -> str:
    """ember's wasm thread pool (issue 19 part 2) at ``threads`` workers; its description."""
    set_threads = getattr(ember.wasm, "set_threads", None)
    if set_threads is None:
        raise BenchUnavailable("this wheel has no ember.wasm.set_threads (the wasm thread pool has "
                               "not landed yet)")
    r = set_threads(threads)
    if inspect.isawaitable(r):
        await r
    try:   # the team's workers start in the background: time nothing before they are up
        from ember.wasm.team import init_async
        await init_async(60.0)
    except ImportError:
        pass
    got = getattr(ember.wasm, "threads", lambda: threads)()
    return str(got)


async def setup(model: str, device: str, autotune: bool = False, threads: int = 0) -> dict:
    """Load ``model`` ("mnist" | "minilm") onto ``device``; returns how long each step took (ms).

    On WebGPU, matmul autotuning is off unless ``autotune``: both demo pages turn it off (on
    SwiftShader it benchmarks every variant for each new shape class, tens of seconds), and the
    bench measures what the pages run."""
    t0 = _ms()
    await _init_device(device)
    if device == "webgpu":
        from ember.webgpu import autotune as _autotune

        _autotune.set_enabled(bool(autotune))
    pool = await _set_threads(threads) if threads and device == "wasm" else None
    t1 = _ms()
    mod = await _module(model)
    inputs = json.loads(await ember.wasm.fetch_bytes("/cache/inputs.json"))
    url = "/demos/mnist/mnist.safetensors" if model == "mnist" else "/cache/minilm.f32.safetensors"
    weights = await ember.wasm.fetch_bytes(url)
    t2 = _ms()
    net = mod.load_model(weights, device=device)
    t3 = _ms()
    feeds = {}
    for name, w in inputs.items():
        if model == "mnist" and name == "mnist":
            feeds[name] = [(array("f", w["pixels"]).tobytes(), tuple(w["shape"]), "float32")]
        elif model == "minilm" and name.startswith("minilm"):
            b, n = len(w["input_ids"]), len(w["input_ids"][0])
            feeds[name] = [(array("q", [v for row in w[k] for v in row]).tobytes(), (b, n), "int64")
                           for k in ("input_ids", "attention_mask")]
    # ember's fast path, as the MNIST page runs it: one plan recorded per input signature,
    # replayed on every later call (eager figures: bench wasm and bench core).
    fn = ember.compile(net) if model == "mnist" else ember.compile(net.sentence_embedding)
    _state.update(model=model, device=device, net=net, fn=fn, feeds=feeds)
    return {"device_init_ms": t1 - t0, "weights_fetch_ms": t2 - t1, "model_build_ms": t3 - t2,
            "weights_bytes": len(weights), "devices": ",".join(ember.devices()),
            **({"pool_threads": pool} if pool is not None else {}),
            # which kernel module runs (kernels.wasm or kernels_relaxed.wasm, where the wheel says)
            **({"wasm_module": ember.wasm.info().get("module")} if device == "wasm" else {})}


def _flat(values) -> list:
    out = []
    for v in values:
        if isinstance(v, list):
            out.extend(_flat(v))
        else:
            out.append(v)
    return out


def run(name: str):
    """One inference of workload ``name``; the output read back as a flat list of floats.

    On "wasm" and "python" the output already lies in Pyodide's memory: it is read synchronously
    and ``run`` returns the list (a plain call from JS, as a page calls a model on the CPU). An
    ``async def`` here would cost a round through Pyodide's event loop per call (JS awaiting a
    coroutine schedules it as a task: a macrotask, 0.05-0.5 ms), more than the MNIST forward
    itself. On "webgpu" the readback is awaited: ``run`` returns a coroutine, which JS awaits."""
    device, fn = _state["device"], _state["fn"]
    args = [ember.from_bytes(raw, shape, dtype, device=device) for raw, shape, dtype in _state["feeds"][name]]
    out = fn(*args)
    if device == "webgpu":
        return _read_async(out)
    return _flat(out.tolist())


async def _read_async(out) -> list:
    return _flat(await out.data_async())
