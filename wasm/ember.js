// ember.js: boot Pyodide from the site's own files and install the ember wheel, offline --
// on the page's thread, or in a dedicated Web Worker so that the page never freezes.
//
// Served at /wasm/ember.js by `python build.py demo` (site layout: ember/web/site.py).
// Nothing here reaches the internet: Pyodide comes from /pyodide/, the wheel from /wheels/,
// and site/manifest.json says which wheel to take (and the hash of every demo file). The
// manifest's "extra_wheels" (pure-Python dependencies Pyodide does not ship, e.g. jinja2 for
// ember's chat templates) are installed from /wheels/ too, before `import ember`.
//
// API (an ES module; every function is async and throws an Error that says what failed):
//
//   loadEmber({baseUrl, onProgress, webgpu, wasm, worker, prefetch, onDownload, snapshot}) -> pyodide | EmberWorker
//       baseUrl:    where the site root is (default: the folder above this file, so a page
//                   anywhere on the site can just `import {loadEmber} from "/wasm/ember.js"`).
//       onProgress: ({fraction, label, ms}) => void, called as the stages go by:
//                   "Loading Python runtime", "Downloading ember", "Installing ember",
//                   "Starting WebAssembly SIMD" (only when ember has the wasm backend),
//                   "Starting WebGPU" (only with webgpu), "Ready". fraction is 0..1,
//                   ms the time since loadEmber was called.
//       webgpu:     false (default) | true | "auto". true awaits `ember.webgpu.init()` and
//                   throws if it fails; "auto" tries it and falls back to the CPU quietly.
//       wasm:       "auto" (default) | false. "auto" runs `await ember.wasm.init()` when the
//                   wheel has it (the WebAssembly SIMD backend, device "wasm"); a failure is
//                   recorded in info.wasmError, never thrown.
//       worker:     false (default): Pyodide runs on this thread and the pyodide object is
//                   returned (`pyodide.ember` holds the info below). true: Pyodide + ember run
//                   in a dedicated module Worker and an EmberWorker (below) is returned.
//       prefetch:   (worker only) URLs to start downloading at once, in parallel with the boot;
//                   a later worker.fetchFile / ctx.fetch of the same URL takes that download.
//       onDownload: (worker only) ({url, loaded, total, fraction, cached}) => void for prefetches.
//       snapshot:   "auto" (default) | false. "auto" boots from a memory snapshot taken after
//                   `import ember` when this browser holds a valid one for this ember wheel and
//                   Pyodide (snapshot.js: checked by length and SHA-256; a stale, corrupt or
//                   refused one is dropped and the page boots the normal way), else from the
//                   site's prebuilt one (manifest "snapshot", made when the site was built:
//                   the same checks; on any mismatch it is not used), and otherwise
//                   makes one in a background Worker shortly after the boot (Cache API
//                   "ember-snapshot"), for the next visit. The default can be set for a whole
//                   page with `globalThis.EMBER_SNAPSHOT = false` before loadEmber runs (the
//                   e2e suite does, so that its fresh contexts do not all make one).
//       info = {version, webgpu, webgpuError, wasm, wasmError, devices, timings, manifest, snapshot}:
//       snapshot = {used, source, note, bytes, ms, saving}: whether this boot restored a snapshot
//       (source "browser": the Cache API's, "site": the site's prebuilt one) and why not
//       (Python sees the same in `ember.wasm.boot_info()`);
//       timings = {boot, manifest, pyodideImported, asmCompiled, pyodideReady, wheelFetched,
//                 installed, emberImported, wasmReady, webgpuReady} in ms since loadEmber (each
//                 also a performance mark "ember:<step>" in the page's or the worker's
//                 timeline), plus pyc: whether the site's precompiled modules were installed
//                 (manifest "wheel_pyc") and wheelCached;
//       devices is `ember.devices()`. The wheel's import is checked at load time.
//       Calling it twice returns the same instance (one Pyodide per page and per mode).
//
//   initWebGPU(pyodide) -> {ok, error}
//       Runs `await ember.webgpu.init()` once; ok=false with the reason when the browser has
//       no usable adapter (then device "python" still works).
//
//   fetchBytes(url, {onProgress, label, cache}) -> Uint8Array
//       Downloads a file (e.g. weights) reporting ({fraction, label, loaded, total, cached}) as
//       bytes arrive. cache: true keeps the response in the browser's Cache API ("ember-assets")
//       and answers later calls from there without touching the network; use it only for
//       versioned URLs (versionedUrl below): an older version of the same path is dropped when a
//       new one is stored. Hand bytes to Python with `pyodide.globals.set("data", bytes)`;
//       Python sees a JsProxy of the Uint8Array and `data.to_bytes()` gives bytes (one copy).
//       From Python, `await ember.wasm.fetch_bytes(url)` does the same (no cache).
//
//   versionedUrl(url, manifest, baseUrl) -> {url, versioned}
//       `url` with `?v=<hash>` appended when the manifest knows the file's hash (every file of
//       the site's demos/ and its wheel), so that the URL names one exact content.
//
//   snapshotSaved() -> {ok, bytes, ms, error} | null
//       Waits for the background snapshot of this page's boot to be stored (null: none is being
//       made). EmberWorker has the same method.
//
//   readManifest(baseUrl) -> {wheel, wheel_sha256, ember_version, pyodide_version,
//                             pyodide_python, demos, files}
//
// EmberWorker (what loadEmber({worker: true}) returns). Values cross with the structured clone:
//   Python results come back through toJs (lists -> arrays, dicts -> plain objects, bytes ->
//   Uint8Array, transferred without a copy); JS arguments reach Python through to_py (arrays ->
//   lists, objects -> dicts, typed arrays -> memoryview, e.g. format "f" for a Float32Array).
//   A failure rejects with an EmberError: .message "ValueError: what went wrong", .pythonType
//   ("ValueError"), .pythonMessage (without the type), .traceback (the Python traceback text).
//   A cancelled call rejects with an EmberError whose .name is "AbortError".
//
//   worker.info                                   the info above (+ crossOriginIsolated, worker: true)
//   await worker.runPython(code)                  pyodide.runPython in the worker -> value
//   await worker.runPythonAsync(code)             pyodide.runPythonAsync (top-level await, JSPI) -> value
//   await worker.call(module, fn, args, {kwargs, signal, onProgress, transfer})
//        imports `module`, calls fn(*args, **kwargs) and awaits it when it is a coroutine.
//        signal: an AbortSignal; aborting it makes `ember_worker.cancelled()` true inside the
//        call (Python checks it where it can stop: between sentences, layers...). onProgress
//        receives what the call reports with `ember_worker.progress(fraction, label, **extra)`.
//        transfer: ArrayBuffers among args to move instead of copy.
//   await worker.initWebGPU()                     -> {ok, error}; updates worker.info.webgpu
//   worker.onWebGPULost(fn)                       -> fn(reason) when the GPU device is lost later;
//                                                   info.webgpu turns false (pages fall back to the CPU)
//   await worker.fetchFile(url, path, {cache, onProgress}) -> {bytes, cached}
//        downloads into Pyodide's file system (cache "auto": the Cache API for URLs the
//        manifest versions; true/false force it).
//   await worker.loadFiles(dir, urls)             fetch small files (e.g. model.py, app.py) into
//                                                 `dir` and put `dir` on sys.path
//   await worker.callJs(moduleUrl, fn, args)      runs fn(ctx, ...args) from a JS module imported
//        in the worker, next to Pyodide: ctx = {pyodide, fetch(url, {onProgress}) -> {bytes,
//        cached}, progress(fraction, label, extra), writeFile(path, bytes)}; for work that must
//        not run on the page's thread and is faster in JS than in Python.
//   worker.terminate()                            stops the worker (pending calls reject); a later
//                                                 loadEmber({worker: true}) starts a new one
//
//   Inside the worker, Python code can `import ember_worker`: cancelled() -> bool,
//   check_cancelled() (raises ember_worker.Cancelled), progress(fraction=None, label=None, **extra).
//   Calls run concurrently where Python awaits (a GPU warm-up waiting on the GPU lets a CPU
//   call run meanwhile); serialise them on the page where order matters.
//
// Worker protocol (the messages, should you talk to the worker without EmberWorker):
//   page -> worker: {id, op, ...}; op is one of boot {baseUrl, webgpu, wasm, prefetch, flags},
//     runPython {code}, runPythonAsync {code}, call {module, fn, args, kwargs, slot},
//     initWebGPU, fetchFile {url, path, cache}, loadFiles {dir, urls}, callJs {module, fn, args};
//     and {op: "abort", slot} (no reply). `flags` is an Int32Array on a SharedArrayBuffer
//     (null when the page is not cross-origin isolated): the page sets flags[slot] = 1 to
//     cancel the call that was given that slot, and the worker reads it while Python runs.
//   worker -> page: {id, ok: true, value} | {id, ok: false, error: {name, message, pythonType,
//     pythonMessage, traceback}} | {type: "progress", id, fraction, label, ...} for call `id`
//     | {type: "download", url, loaded, total, fraction, cached} for prefetches.
//
// Example:
//   <script type="module">
//     import { loadEmber } from "/wasm/ember.js";
//     const ember = await loadEmber({worker: true, onProgress: p => console.log(p.label, p.fraction)});
//     console.log(await ember.runPython("import ember; str(ember.tensor([1.0, 2.0]) * 3)"));
//   </script>

import { lookForSnapshot, startPyodide, checkRestored, scheduleSnapshot, snapshotSaved, unzip, writeFiles } from "./snapshot.js";
export { snapshotSaved };

const HERE = new URL(".", import.meta.url);        // .../wasm/
const DEFAULT_BASE = new URL("..", HERE).href;      // the site root
const WORKER_NAME = "ember";                        // how this file knows it runs as the worker
const CACHE_NAME = "ember-assets";
const FLAG_SLOTS = 256;

let booting = null;         // the one Pyodide of this page (a promise, so concurrent callers share it)
let bootingWorker = null;   // the one EmberWorker of this page

function clamp01(x) {
  return x < 0 ? 0 : x > 1 ? 1 : x;
}

function withSlash(url) {
  return url.endsWith("/") ? url : url + "/";
}

function siteBase(baseUrl) {
  return withSlash(new URL(baseUrl || DEFAULT_BASE, globalThis.location?.href ?? DEFAULT_BASE).href);
}

/** The site's manifest.json: which wheel to install and which Pyodide is served. */
export async function readManifest(baseUrl = DEFAULT_BASE) {
  const url = new URL("manifest.json", withSlash(baseUrl)).href;
  const resp = await fetch(url, { cache: "no-cache" });
  if (!resp.ok) {
    throw new Error(`ember: cannot read ${url} (HTTP ${resp.status}); is this an ember site ` +
                    `built by 'python build.py site'?`);
  }
  return await resp.json();
}

/** `url` with ?v=<hash of its content> when the manifest lists the file. */
export function versionedUrl(url, manifest, baseUrl = DEFAULT_BASE) {
  const base = siteBase(baseUrl);
  const u = new URL(url, globalThis.location?.href ?? base);
  if (u.searchParams.has("v")) return { url: u.href, versioned: true };
  const basePath = new URL(base).pathname;
  if (u.origin !== new URL(base).origin || !u.pathname.startsWith(basePath)) return { url: u.href, versioned: false };
  const rel = decodeURIComponent(u.pathname.slice(basePath.length));
  const hash = manifest && manifest.files ? manifest.files[rel]
             : null;
  const wheel = manifest && rel === manifest.wheel && manifest.wheel_sha256 ? manifest.wheel_sha256.slice(0, 16) : null;
  const v = hash || wheel;
  if (!v) return { url: u.href, versioned: false };
  u.searchParams.set("v", v);
  return { url: u.href, versioned: true };
}

/** The size of the body fetch() will hand out, or 0 when unknown. Content-Length counts
 *  *encoded* bytes when the server gzips; ember.web then sends X-Uncompressed-Length. */
function decodedLength(headers) {
  const encoded = (headers.get("Content-Encoding") || "identity") !== "identity";
  const n = encoded ? headers.get("X-Uncompressed-Length") : headers.get("Content-Length");
  return Number(n || 0);
}

async function openCache() {
  if (!globalThis.caches) return null;   // not a secure context, or a browser without it
  try {
    return await caches.open(CACHE_NAME);
  } catch (e) {
    console.warn("ember: the Cache API is not usable here, downloading every time:", e);
    return null;
  }
}

/** Store a fresh download and drop older versions of the same path (other ?v=). */
async function cacheStore(cache, url, bytes, headers) {
  try {
    await cache.put(url, new Response(bytes, { headers: {
      "Content-Type": headers.get("Content-Type") || "application/octet-stream",
      "Content-Length": String(bytes.length) } }));
    const u = new URL(url, globalThis.location?.href);
    for (const req of await cache.keys()) {
      const k = new URL(req.url);
      if (k.origin === u.origin && k.pathname === u.pathname && k.search !== u.search) await cache.delete(req);
    }
  } catch (e) {   // quota, private mode...: the download still counts
    console.warn(`ember: could not keep ${url} in the browser cache:`, e);
  }
}

/** fetchBytes, plus whether the bytes came from the Cache API: {bytes, cached}. */
async function fetchBytesInfo(url, { onProgress = null, label = null, cache = false } = {}) {
  const name = label || `Downloading ${url.split("?")[0].split("/").pop()}`;
  const store = cache ? await openCache() : null;
  if (store) {
    const hit = await store.match(url);
    if (hit) {
      const bytes = new Uint8Array(await hit.arrayBuffer());
      if (onProgress) onProgress({ fraction: 1, label: name, loaded: bytes.length, total: bytes.length, cached: true });
      return { bytes, cached: true };
    }
  }
  const resp = await fetch(url);
  if (!resp.ok) {
    throw new Error(`ember: download of ${url} failed: HTTP ${resp.status} ${resp.statusText}`);
  }
  const total = decodedLength(resp.headers);
  const report = (loaded, done) => {
    if (onProgress) {
      onProgress({ fraction: done ? 1 : total ? clamp01(loaded / total) : 0,
                   label: name, loaded, total: done ? loaded : total, cached: false });
    }
  };
  report(0, false);
  let out;
  if (!resp.body) {   // very old engines: no streaming
    out = new Uint8Array(await resp.arrayBuffer());
  } else {
    const reader = resp.body.getReader();
    const chunks = [];
    let loaded = 0;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      chunks.push(value);
      loaded += value.length;
      report(loaded, false);
    }
    out = new Uint8Array(loaded);
    let at = 0;
    for (const c of chunks) {
      out.set(c, at);
      at += c.length;
    }
  }
  report(out.length, true);
  if (store) await cacheStore(store, url, out, resp.headers);
  return { bytes: out, cached: false };
}

/** Download `url` into a Uint8Array, reporting progress as the bytes arrive. */
export async function fetchBytes(url, options = {}) {
  return (await fetchBytesInfo(url, options)).bytes;
}

/** `await ember.webgpu.init()` inside Pyodide; {ok, error} instead of throwing. `onLost(reason)`
 *  runs if the GPU device is lost later (GPUDevice.lost: a driver reset, the browser reclaiming
 *  it); ember then raises DeviceLostError for webgpu tensors, and pages move to the CPU. */
export async function initWebGPU(pyodide, onLost = null) {
  if (!globalThis.navigator || !navigator.gpu) {
    return { ok: false, error: "this browser has no WebGPU (navigator.gpu is missing)" };
  }
  try {
    await pyodide.runPythonAsync("import ember.webgpu\nawait ember.webgpu.init()");
    if (onLost) {
      try {
        const dev = pyodide.runPython("from ember.webgpu.runtime import _RUNTIME\ngetattr(_RUNTIME[0].driver, '_dev', None)");
        if (dev && dev.lost) {
          dev.lost.then((info) => onLost(`the GPU device was lost (${info.reason || "unknown reason"}` +
                                         `${info.message ? ": " + info.message : ""})`));
        }
      } catch (e) { /* no device handle to watch: loss still raises DeviceLostError in Python */ }
    }
    return { ok: true, error: null };
  } catch (e) {
    return { ok: false, error: String(e && e.message ? e.message : e).trim().split("\n").pop() };
  }
}

/** `await ember.wasm.init()` when this ember has the WebAssembly SIMD backend: {ok, error}. */
async function initWasm(pyodide) {
  const has = pyodide.runPython("import ember.wasm\ncallable(getattr(ember.wasm, 'init', None))");
  if (!has) return { ok: false, error: "this ember has no WebAssembly SIMD backend (ember.wasm.init)" };
  try {
    await pyodide.runPythonAsync("import ember.wasm\nawait ember.wasm.init()");
    return { ok: pyodide.runPython("import ember\n'wasm' in ember.devices()"), error: null };
  } catch (e) {
    return { ok: false, error: String(e && e.message ? e.message : e).trim().split("\n").pop() };
  }
}

async function boot({ baseUrl, onProgress, webgpu, wasm = "auto", onManifest = null, snapshot = "auto" }) {
  const t0 = performance.now();
  const base = siteBase(baseUrl);
  const progress = (fraction, label) => {
    if (onProgress) onProgress({ fraction, label, ms: performance.now() - t0 });
  };
  const timings = {};
  // Each step of the start, as performance marks ("ember:<step>", in the page's or the worker's
  // timeline: a DevTools profile shows them) and in info.timings (ms since loadEmber's call).
  const mark = (step) => {
    timings[step] = performance.now() - t0;
    try { performance.mark(`ember:${step}`); } catch (e) { /* no User Timing here */ }
  };
  mark("boot");

  progress(0, "Loading Python runtime");
  const indexURL = new URL("pyodide/", base).href;
  // Pyodide's module (9.6 MB) compiled from the start, while the manifest, pyodide.mjs and the
  // snapshot lookup are on their way: V8 compiles a module's bytes once per process (its native
  // module cache: Pyodide's own instantiateStreaming of the same bytes waits for this compile or
  // finds it done), and a streamed compile of an HTTP-cached response reuses V8's code cache
  // on a revisit.
  if (typeof WebAssembly.compileStreaming === "function" && globalThis.fetch) {
    WebAssembly.compileStreaming(fetch(indexURL + "pyodide.asm.wasm"))
      .then(() => mark("asmCompiled"), () => {});
  }
  // The manifest, and then the wheel, download while Pyodide starts (no need to wait for it).
  const manifestP = readManifest(base);
  manifestP.then(() => mark("manifest"), () => {});
  const wheelP = manifestP.then((manifest) => {
    if (onManifest) onManifest(manifest);
    return fetchBytesInfo(versionedUrl(new URL(manifest.wheel, base).href, manifest, base).url,
                          { label: "Downloading ember", cache: !!manifest.wheel_sha256 });
  });
  wheelP.catch(() => {});   // awaited below; not an unhandled rejection meanwhile
  const extrasP = manifestP.then((manifest) => Promise.all((manifest.extra_wheels || []).map((w) => {
    const v = versionedUrl(new URL(w, base).href, manifest, base);
    return fetchBytesInfo(v.url, { label: "Downloading ember", cache: v.versioned });
  })));
  extrasP.catch(() => {});
  // The snapshot's lookup (and a first visit's download of the site's own) while pyodide.mjs loads.
  const foundP = lookForSnapshot(base, manifestP, snapshot);
  // ember's modules precompiled by this Pyodide (site.py, manifest "wheel_pyc"), for this wheel
  // only, and not when a snapshot is to be restored (it holds those modules imported already).
  const pycP = Promise.all([manifestP, foundP]).then(([manifest, found]) => !found.bytes && manifest.wheel_pyc
    && manifest.wheel_pyc_for === manifest.wheel_sha256
    ? fetchBytesInfo(versionedUrl(new URL(manifest.wheel_pyc, base).href, manifest, base).url,
                     { label: "Downloading ember", cache: true }).then((r) => r.bytes, () => null)
    : null);
  // The wheels unzipped by the browser while Pyodide starts (snapshot.js); null: Pyodide unpacks them.
  const unzippedP = Promise.all([wheelP, extrasP, pycP]).then(([w, ex, pyc]) =>
    Promise.all([w.bytes, ...ex.map((x) => x.bytes), ...(pyc ? [pyc] : [])].map(unzip))).catch(() => null);
  const { loadPyodide } = await import(new URL("pyodide.mjs", indexURL).href);
  mark("pyodideImported");
  // From a memory snapshot after `import ember` when one is stored or served (snapshot.js), else as usual.
  const { pyodide, snapshot: snap } = await startPyodide(loadPyodide, indexURL, base, manifestP, snapshot, foundP);
  const manifest = await manifestP;
  mark("pyodideReady");
  progress(0.7, "Downloading ember");

  // The wheel's name carries its version; the ?v= hash makes a rebuilt wheel of the same
  // version a new URL, which the browser keeps (Cache API) and the server lets it keep.
  const { bytes: wheel, cached: wheelCached } = await wheelP;
  mark("wheelFetched");
  timings.wheelCached = wheelCached;
  progress(0.85, "Installing ember");
  const sitePackages = pyodide.runPython("import site; site.getsitepackages()[0]");
  const pyc = await pycP;
  const unzipped = await unzippedP;
  if (unzipped) for (const files of unzipped) writeFiles(pyodide, sitePackages, files);
  else {
    pyodide.unpackArchive(wheel, "wheel", { extractDir: sitePackages });
    for (const extra of await extrasP) pyodide.unpackArchive(extra.bytes, "wheel", { extractDir: sitePackages });
    if (pyc) pyodide.unpackArchive(pyc, "zip", { extractDir: sitePackages });
  }
  timings.pyc = !!pyc;
  mark("installed");
  // Check the import here: a broken install must fail loudly at load time, not in a demo.
  if (snap.used) {
    try {
      await checkRestored(pyodide, base, manifest);
    } catch (e) {   // boot again the normal way, saying why
      const r = await boot({ baseUrl, onProgress, webgpu, wasm, onManifest: null, snapshot: false });
      r.ember.snapshot.note = e.message;
      tellPython(r, r.ember.snapshot);
      return r;
    }
  }
  try {
    pyodide.runPython("import importlib; importlib.invalidate_caches(); import ember");
  } catch (e) {
    throw new Error(`ember: the wheel ${manifest.wheel} installed but 'import ember' failed: ${e}`);
  }
  mark("emberImported");
  const info = { version: pyodide.runPython("ember.__version__"), webgpu: false,
                 webgpuError: null, wasm: false, wasmError: null, timings, manifest, snapshot: snap };

  if (wasm) {
    const has = pyodide.runPython("import ember.wasm\ncallable(getattr(ember.wasm, 'init', None))");
    if (has) progress(0.9, "Starting WebAssembly SIMD");
    const r = await initWasm(pyodide);
    info.wasm = r.ok;
    info.wasmError = r.error;
    mark("wasmReady");
  }
  if (webgpu) {
    progress(0.92, "Starting WebGPU");
    const r = await initWebGPU(pyodide);
    info.webgpu = r.ok;
    info.webgpuError = r.error;
    if (!r.ok && webgpu !== "auto") throw new Error(`ember: WebGPU did not start: ${r.error}`);
    timings.webgpuReady = performance.now() - t0;
  }
  info.devices = pyodide.runPython("import ember, json\njson.dumps(list(ember.devices()))");
  info.devices = JSON.parse(info.devices);
  pyodide.ember = info;
  tellPython(pyodide, snap);
  // (the maker gets the .pyc bundle even where this boot restored a snapshot and skipped it)
  const makerPyc = () => pyc || !snap.used || !manifest.wheel_pyc || manifest.wheel_pyc_for !== manifest.wheel_sha256
    ? Promise.resolve(pyc)
    : fetchBytesInfo(versionedUrl(new URL(manifest.wheel_pyc, base).href, manifest, base).url,
                     { cache: true }).then((r) => r.bytes, () => null);
  const extras = (await extrasP).map((x) => x.bytes);
  scheduleSnapshot(base, manifest, () => makerPyc().then((p) => [wheel, ...extras, ...(p ? [p] : [])]), snap);
  progress(1, "Ready");
  return pyodide;
}

/** `ember.wasm.boot_info()` reports how this Pyodide started (a wheel without it: nothing). */
function tellPython(pyodide, snap) {
  try {
    pyodide.runPython(`import ember.wasm as _w\nif hasattr(_w, "_BOOT"): _w._BOOT.update(snapshot=${snap.used ? "True" : "False"}, ` +
                      `snapshot_note=${JSON.stringify(snap.note)})\ndel _w`);
  } catch (e) { /* an older wheel */ }
}

/** Boot Pyodide and install ember (once per page); see the API notes at the top. */
export async function loadEmber({ baseUrl = null, onProgress = null, webgpu = false, wasm = "auto",
                                  worker = false, prefetch = [], onDownload = null,
                                  snapshot = globalThis.EMBER_SNAPSHOT ?? "auto" } = {}) {
  if (worker) {
    if (!bootingWorker) {
      const w = new EmberWorker({ baseUrl });
      bootingWorker = w._boot({ onProgress, webgpu, wasm, prefetch, onDownload, snapshot }).then(() => w, (e) => {
        bootingWorker = null;
        w.terminate();
        throw e;
      });
      return bootingWorker;
    }
    const w = await bootingWorker;
    if (w.terminated) {   // terminate() ended it: start a new one
      bootingWorker = null;
      return loadEmber({ baseUrl, onProgress, webgpu, wasm, worker, prefetch, onDownload, snapshot });
    }
    if (webgpu && !w.info.webgpu) {
      const r = await w.initWebGPU();
      if (!r.ok && webgpu !== "auto") throw new Error(`ember: WebGPU did not start: ${r.error}`);
    }
    if (onProgress) onProgress({ fraction: 1, label: "Ready", ms: 0 });
    return w;
  }
  if (!booting) {
    booting = boot({ baseUrl, onProgress, webgpu, wasm, snapshot }).catch((e) => {
      booting = null;   // let a later call retry after a failure
      throw e;
    });
    return booting;
  }
  const pyodide = await booting;
  if (webgpu && !pyodide.ember.webgpu) {
    const r = await initWebGPU(pyodide);
    pyodide.ember.webgpu = r.ok;
    pyodide.ember.webgpuError = r.error;
    if (!r.ok && webgpu !== "auto") throw new Error(`ember: WebGPU did not start: ${r.error}`);
  }
  if (onProgress) onProgress({ fraction: 1, label: "Ready", ms: 0 });
  return pyodide;
}

// ---- the page's side of the worker -------------------------------------------------------------

/** An error from the worker; for Python exceptions with the type, message and traceback. */
export class EmberError extends Error {
  constructor(info) {
    super(info.message || "ember worker: unknown error");
    this.name = info.name || "EmberError";
    this.pythonType = info.pythonType || null;
    this.pythonMessage = info.pythonMessage ?? null;
    this.traceback = info.traceback || null;
  }
}

/** ArrayBuffers inside `value` (typed arrays and plain buffers, a few levels deep). */
function buffersIn(value, out = new Set(), depth = 0) {
  if (!value || typeof value !== "object" || depth > 4) return out;
  if (value instanceof ArrayBuffer) out.add(value);
  else if (ArrayBuffer.isView(value)) {
    if (value.buffer instanceof ArrayBuffer) out.add(value.buffer);
  } else if (Array.isArray(value)) {
    if (value.length <= 4096) for (const v of value) buffersIn(v, out, depth + 1);
  } else if (Object.getPrototypeOf(value) === Object.prototype) {
    for (const v of Object.values(value)) buffersIn(v, out, depth + 1);
  }
  return out;
}

/** Pyodide + ember in a dedicated Web Worker; see the API notes at the top. */
export class EmberWorker {
  constructor({ baseUrl = null } = {}) {
    this.baseUrl = siteBase(baseUrl);
    this.info = null;
    this.terminated = false;
    this.worker = new Worker(new URL(import.meta.url), { type: "module", name: WORKER_NAME });
    this._next = 1;
    this._pending = new Map();   // id -> {resolve, reject, onProgress, slot}
    this._onWebGPULost = [];     // callbacks for GPUDevice.lost (onWebGPULost)
    this._onDownload = null;
    // Cancellation flags the worker can read while Python holds its thread.
    this._flags = globalThis.crossOriginIsolated && typeof SharedArrayBuffer === "function"
      ? new Int32Array(new SharedArrayBuffer(4 * FLAG_SLOTS)) : null;
    this._freeSlots = Array.from({ length: FLAG_SLOTS }, (_, i) => FLAG_SLOTS - 1 - i);
    this.worker.onmessage = (e) => this._receive(e.data);
    this.worker.onerror = (e) => {
      e.preventDefault();
      this._failAll(new EmberError({ name: "EmberError", message:
        `ember worker failed: ${e.message || "the worker script did not load"}` }));
    };
    this.worker.onmessageerror = () => this._failAll(new EmberError({ message: "ember worker: a message could not be read" }));
  }

  _receive(msg) {
    if (msg.type === "download") {
      if (this._onDownload) this._onDownload(msg);
      return;
    }
    if (msg.type === "webgpuLost") {    // GPUDevice.lost in the worker: webgpu is gone
      if (this.info) {
        this.info.webgpu = false;
        this.info.webgpuError = msg.reason;
      }
      for (const f of this._onWebGPULost) f(msg.reason);
      return;
    }
    const p = this._pending.get(msg.id);
    if (!p) return;
    if (msg.type === "progress") {
      if (p.onProgress) p.onProgress(msg);
      return;
    }
    this._pending.delete(msg.id);
    this._release(p.slot);
    if (msg.ok) p.resolve(msg.value);
    else p.reject(new EmberError(msg.error));
  }

  _failAll(err) {
    for (const p of this._pending.values()) {
      this._release(p.slot);
      p.reject(err);
    }
    this._pending.clear();
  }

  _release(slot) {
    if (slot == null || slot < 0) return;
    if (this._flags) Atomics.store(this._flags, slot, 0);
    this._freeSlots.push(slot);
  }

  _send(op, payload = {}, { onProgress = null, transfer = [], signal = null } = {}) {
    if (signal && signal.aborted) {
      return Promise.reject(new EmberError({ name: "AbortError", message: "cancelled", pythonType: "Cancelled" }));
    }
    const id = this._next++;
    let slot = -1;
    if (signal) {
      slot = this._freeSlots.pop();
      if (slot === undefined) slot = -1;
    }
    return new Promise((resolve, reject) => {
      this._pending.set(id, { resolve, reject, onProgress, slot });
      if (signal && slot >= 0) {
        signal.addEventListener("abort", () => {
          if (!this._pending.has(id)) return;
          if (this._flags) Atomics.store(this._flags, slot, 1);
          this.worker.postMessage({ op: "abort", slot });   // for a page without SharedArrayBuffer
        }, { once: true });
      }
      try {
        this.worker.postMessage({ id, op, slot, ...payload }, transfer);
      } catch (e) {
        this._pending.delete(id);
        this._release(slot);
        reject(new EmberError({ name: "DataCloneError", message: `ember worker: cannot send ${op}: ${e.message || e}` }));
      }
    });
  }

  async _boot({ onProgress, webgpu, wasm, prefetch, onDownload, snapshot }) {
    this._onDownload = onDownload;
    const abs = prefetch.map((u) => new URL(u, globalThis.location?.href ?? this.baseUrl).href);
    this.info = await this._send("boot", { baseUrl: this.baseUrl, webgpu, wasm, prefetch: abs, flags: this._flags, snapshot },
                                 { onProgress });
    return this;
  }

  runPython(code) { return this._send("runPython", { code }); }

  /** The background snapshot's result {ok, bytes, ms, error} once stored, or null (none made). */
  snapshotSaved() { return this._send("snapshotSaved"); }

  runPythonAsync(code) { return this._send("runPythonAsync", { code }); }

  call(module, fn, args = [], { kwargs = {}, signal = null, onProgress = null, transfer = [] } = {}) {
    return this._send("call", { module, fn, args, kwargs }, { signal, onProgress, transfer });
  }

  /** `f(reason)` runs when the worker's GPU device is lost after initWebGPU succeeded. */
  onWebGPULost(f) {
    this._onWebGPULost.push(f);
  }

  async initWebGPU() {
    const r = await this._send("initWebGPU");
    this.info.webgpu = r.ok;
    this.info.webgpuError = r.error;
    return r;
  }

  fetchFile(url, path, { cache = "auto", onProgress = null } = {}) {
    const abs = new URL(url, globalThis.location?.href ?? this.baseUrl).href;
    return this._send("fetchFile", { url: abs, path, cache }, { onProgress });
  }

  loadFiles(dir, urls) {
    const base = globalThis.location?.href ?? this.baseUrl;
    return this._send("loadFiles", { dir, urls: urls.map((u) => new URL(u, base).href) });
  }

  callJs(moduleUrl, fn, args = [], { onProgress = null, transfer = [] } = {}) {
    const abs = new URL(moduleUrl, globalThis.location?.href ?? this.baseUrl).href;
    return this._send("callJs", { module: abs, fn, args }, { onProgress, transfer });
  }

  terminate() {
    this.terminated = true;
    this.worker.terminate();
    this._failAll(new EmberError({ name: "AbortError", message: "the ember worker was terminated" }));
  }
}

// ---- the worker's side ---------------------------------------------------------------------------

// `ember_worker`, the module Python code in the worker imports (cancel checks and progress).
const WORKER_PY = `
import contextvars, importlib, inspect, sys, types

import _ember_worker_js as _js

_call = contextvars.ContextVar("ember_worker_call", default=(0, -1))


class Cancelled(Exception):
    """The page cancelled this call (its AbortSignal fired)."""


def cancelled() -> bool:
    """True once the page asked to cancel the call this code runs in."""
    return bool(_js.isCancelled(_call.get()[1]))


def check_cancelled() -> None:
    """Raise Cancelled when the page asked to cancel the running call."""
    if cancelled():
        raise Cancelled("cancelled")


def progress(fraction=None, label=None, **extra) -> None:
    """Report progress of the running call to its onProgress on the page."""
    from pyodide.ffi import to_js
    import js
    _js.progress(_call.get()[0], fraction, label, to_js(extra, dict_converter=js.Object.fromEntries))


def _run(call_id, slot, module, fn, args, kwargs):
    # A plain def: JS calling an async def would run it as a task on Pyodide's event loop, a
    # macrotask round per call (0.05-0.5 ms, more than a small model's forward). A function that
    # returns a coroutine gets one: the call's context variable is set around the synchronous
    # part here and, in _finish's own task, around the awaited rest, so interleaved calls each
    # see their own.
    token = _call.set((call_id, slot))
    try:
        args = args.to_py() if hasattr(args, "to_py") else list(args)
        kwargs = kwargs.to_py() if hasattr(kwargs, "to_py") else dict(kwargs)
        check_cancelled()
        f = getattr(importlib.import_module(module), fn)
        r = f(*args, **kwargs)
    finally:
        _call.reset(token)
    return _finish(call_id, slot, r) if inspect.isawaitable(r) else r


async def _finish(call_id, slot, r):
    _call.set((call_id, slot))
    return await r
`;

/** PyProxy -> something postMessage can clone (lists, dicts, bytes, numbers, strings). */
function toClonable(value, what) {
  if (!value || typeof value !== "object" || typeof value.toJs !== "function") return value;
  try {
    return value.toJs({ dict_converter: Object.fromEntries, create_pyproxies: false });
  } catch (e) {
    const type = String(value.type || "object");
    throw Object.assign(new Error(`${what} returned a Python ${type}, which cannot be sent to the page: ` +
                                  "return lists, dicts, str, numbers or bytes"), { name: "TypeError" });
  } finally {
    value.destroy();
  }
}

function errorInfo(e) {
  if (e && e.name === "PythonError" && typeof e.type === "string" && typeof e.message === "string") {
    // e.message is the whole traceback; its last line is "Type: message".
    const lines = e.message.trim().split("\n");
    const last = lines[lines.length - 1] || e.type;
    // "ValueError: x", or with the module for classes defined outside builtins ("m.Cancelled: x").
    const colon = last.indexOf(": ");
    const head = colon >= 0 ? last.slice(0, colon) : last;
    const msg = head === e.type || head.endsWith(`.${e.type}`) ? (colon >= 0 ? last.slice(colon + 2) : "") : last;
    const name = e.type === "Cancelled" ? "AbortError" : "PythonError";
    return { name, message: `${e.type}: ${msg}`, pythonType: e.type, pythonMessage: msg, traceback: e.message };
  }
  return { name: (e && e.name) || "Error", message: String(e && e.message ? e.message : e),
           pythonType: null, pythonMessage: null, traceback: null };
}

function installWorker() {
  let pyodideP = null;          // the booted Pyodide (a promise)
  let base = DEFAULT_BASE;
  let manifest = null;
  let flags = null;             // Int32Array on a SharedArrayBuffer, or null
  const aborted = new Set();    // slots cancelled by message (no SharedArrayBuffer)
  const prefetched = new Map(); // url -> promise of {bytes, cached}
  let manifestReady = null;
  let runCall = null;           // ember_worker._run (a PyProxy, kept)
  const post = (msg, transfer = []) => self.postMessage(msg, transfer);

  const isCancelled = (slot) => slot >= 0 && (flags ? Atomics.load(flags, slot) !== 0 : aborted.has(slot));

  async function resolveUrl(url, cache) {
    await manifestReady;
    const v = versionedUrl(url, manifest, base);
    return { url: v.url, cache: cache === "auto" ? v.versioned : !!cache };
  }

  /** {bytes, cached}: a prefetched download when there is one, else a new one. */
  async function getBytes(url, { cache = "auto", onProgress = null } = {}) {
    const r = await resolveUrl(url, cache);
    const pre = prefetched.get(r.url);
    if (pre) {
      prefetched.delete(r.url);
      return await pre;
    }
    return await fetchBytesInfo(r.url, { cache: r.cache, onProgress });
  }

  function writeFile(pyodide, path, bytes) {
    const dir = path.slice(0, path.lastIndexOf("/"));
    if (dir) pyodide.FS.mkdirTree(dir);
    pyodide.FS.writeFile(path, bytes);
  }

  const ops = {
    async boot(msg) {
      base = msg.baseUrl || DEFAULT_BASE;
      flags = msg.flags || null;
      let gotManifest;
      manifestReady = new Promise((r) => { gotManifest = r; });
      pyodideP = boot({ baseUrl: base, webgpu: msg.webgpu, wasm: msg.wasm, snapshot: msg.snapshot ?? "auto",
                        onProgress: (p) => post({ type: "progress", id: msg.id, ...p }),
                        onManifest: (m) => {
                          manifest = m;
                          gotManifest();
                          for (const url of msg.prefetch || []) {
                            const v = versionedUrl(url, manifest, base);
                            const p = fetchBytesInfo(v.url, { cache: v.versioned, onProgress: (d) =>
                              post({ type: "download", url, loaded: d.loaded, total: d.total,
                                     fraction: d.fraction, cached: d.cached }) });
                            p.catch(() => {});   // reported when the page asks for it
                            prefetched.set(v.url, p);
                          }
                        } });
      pyodideP.catch(() => gotManifest());
      const pyodide = await pyodideP;
      pyodide.registerJsModule("_ember_worker_js", {
        isCancelled,
        progress: (id, fraction, label, extra) => post({ type: "progress", id, fraction, label,
                                                         ...(extra && typeof extra === "object" ? extra : {}) }),
      });
      // A fresh namespace: nothing lands in the page's (pyodide.globals) namespace.
      pyodide.runPython(`import sys, types\nm = types.ModuleType("ember_worker")\n` +
                        `m.__doc__ = "The ember worker's bridge to the page (cancel checks, progress)."\n` +
                        `exec(src, m.__dict__)\nsys.modules["ember_worker"] = m`,
                        { globals: pyodide.toPy({ src: WORKER_PY }) });
      runCall = pyodide.pyimport("ember_worker")._run;
      const { manifest: _m, ...rest } = pyodide.ember;
      return { ...rest, manifest, worker: true, crossOriginIsolated: !!globalThis.crossOriginIsolated,
               cancelFlags: !!flags };
    },
    async runPython(msg, py) {
      return toClonable(py.runPython(msg.code), "runPython");
    },
    async snapshotSaved() {
      return await snapshotSaved();
    },
    async runPythonAsync(msg, py) {
      return toClonable(await py.runPythonAsync(msg.code), "runPythonAsync");
    },
    async call(msg, py) {
      const a = [msg.id, msg.slot ?? -1, msg.module, msg.fn, msg.args || [], msg.kwargs || {}];
      // Where the engine has JS Promise integration, the call is entered with stack switching on
      // (callPromising), as runPythonAsync's code is: a plain def may then block on a WebGPU or
      // server read (pyodide.ffi.run_sync), e.g. the training page's weights(); no event-loop round.
      const r = await (typeof WebAssembly.Suspending === "function" && runCall.callPromising
        ? runCall.callPromising(...a) : runCall(...a));
      return toClonable(r, `${msg.module}.${msg.fn}`);
    },
    async initWebGPU(msg, py) {
      const r = await initWebGPU(py, (reason) => {
        py.ember.webgpu = false;
        py.ember.webgpuError = reason;
        post({ type: "webgpuLost", reason });
      });
      py.ember.webgpu = r.ok;
      py.ember.webgpuError = r.error;
      return r;
    },
    async fetchFile(msg, py) {
      const r = await getBytes(msg.url, { cache: msg.cache, onProgress: (p) => post({ type: "progress", id: msg.id, ...p }) });
      writeFile(py, msg.path, r.bytes);
      return { bytes: r.bytes.length, cached: r.cached };
    },
    async loadFiles(msg, py) {
      const got = await Promise.all(msg.urls.map((u) => getBytes(u)));
      msg.urls.forEach((u, i) => writeFile(py, `${msg.dir}/${new URL(u).pathname.split("/").pop()}`, got[i].bytes));
      py.runPython(`import sys, importlib\nif ${JSON.stringify(msg.dir)} not in sys.path:\n` +
                   `    sys.path.insert(0, ${JSON.stringify(msg.dir)})\nimportlib.invalidate_caches()`);
      return { files: msg.urls.length, cached: got.filter((g) => g.cached).length };
    },
    async callJs(msg, py) {
      const mod = await import(msg.module);
      if (typeof mod[msg.fn] !== "function") throw new Error(`${msg.module} exports no function ${msg.fn}`);
      const ctx = {
        pyodide: py,
        // Relative URLs: next to the module (or the site root for a blob: module).
        fetch: (url, opts = {}) => getBytes(new URL(url, /^https?:/.test(msg.module) ? msg.module : base).href, opts),
        progress: (fraction, label, extra = {}) => post({ type: "progress", id: msg.id, fraction, label, ...extra }),
        writeFile: (path, bytes) => writeFile(py, path, bytes),
      };
      return await mod[msg.fn](ctx, ...(msg.args || []));
    },
  };

  self.onmessage = async (e) => {
    const msg = e.data;
    if (msg.op === "abort") {
      aborted.add(msg.slot);
      return;
    }
    if (msg.slot >= 0) aborted.delete(msg.slot);   // a reused slot starts clean
    try {
      const op = ops[msg.op];
      if (!op) throw new Error(`ember worker: unknown op ${JSON.stringify(msg.op)}`);
      if (msg.op !== "boot" && !pyodideP) throw new Error("ember worker: not booted (send boot first)");
      const py = msg.op === "boot" ? null : await pyodideP;
      const value = await op(msg, py);
      const transfer = [...buffersIn(value)].filter((b) => !py || b !== py._module.HEAP8.buffer);
      post({ id: msg.id, ok: true, value }, transfer);
    } catch (err) {
      post({ id: msg.id, ok: false, error: errorInfo(err) });
    }
  };
}

if (typeof WorkerGlobalScope !== "undefined" && globalThis instanceof WorkerGlobalScope &&
    globalThis.name === WORKER_NAME) {
  installWorker();
}
