// ember.js: boot Pyodide from the site's own files and install the ember wheel, offline.
//
// Served at /wasm/ember.js by `python build.py demo` (site layout: ember/web/site.py).
// Nothing here reaches the internet: Pyodide comes from /pyodide/, the wheel from /wheels/,
// and site/manifest.json says which wheel to take.
//
// API (an ES module; every function is async and throws an Error that says what failed):
//
//   loadEmber({baseUrl, onProgress, webgpu}) -> pyodide
//       baseUrl:    where the site root is (default: the folder above this file, so a page
//                   anywhere on the site can just `import {loadEmber} from "/wasm/ember.js"`).
//       onProgress: ({fraction, label, ms}) => void, called as the stages go by:
//                   "Loading Python runtime", "Downloading ember", "Installing ember",
//                   "Starting WebGPU" (only with webgpu), "Ready". fraction is 0..1,
//                   ms the time since loadEmber was called.
//       webgpu:     false (default) | true | "auto". true awaits `ember.webgpu.init()` and
//                   throws if it fails; "auto" tries it and falls back to the CPU quietly.
//       The returned pyodide has `import ember` done (checked: a wheel that fails to install
//       is an error here, not later). `pyodide.ember` holds {version, webgpu, webgpuError,
//       timings} where timings = {pyodideReady, emberImported, webgpuReady} in ms.
//       Calling it twice returns the same instance (one Pyodide per page).
//
//   initWebGPU(pyodide) -> {ok, error}
//       Runs `await ember.webgpu.init()` once; ok=false with the reason when the browser has
//       no usable adapter (then device "python" still works).
//
//   fetchBytes(url, {onProgress, label}) -> Uint8Array
//       Downloads a file (e.g. weights) reporting ({fraction, label, loaded, total}) as bytes
//       arrive. Hand it to Python with `pyodide.globals.set("data", bytes)`; Python sees a
//       JsProxy of the Uint8Array and `data.to_bytes()` gives bytes (one copy).
//       From Python, `await ember.wasm.fetch_bytes(url)` does the same.
//
//   readManifest(baseUrl) -> {wheel, wheel_sha256, ember_version, pyodide_version,
//                             pyodide_python, demos}
//
// Example:
//   <script type="module">
//     import { loadEmber } from "/wasm/ember.js";
//     const py = await loadEmber({onProgress: p => console.log(p.label, p.fraction)});
//     console.log(py.runPython("import ember; str(ember.tensor([1.0, 2.0]) * 3)"));
//   </script>

const HERE = new URL(".", import.meta.url);        // .../wasm/
const DEFAULT_BASE = new URL("..", HERE).href;      // the site root

let booting = null;   // the one Pyodide of this page (a promise, so concurrent callers share it)

function clamp01(x) {
  return x < 0 ? 0 : x > 1 ? 1 : x;
}

function withSlash(url) {
  return url.endsWith("/") ? url : url + "/";
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

/** The size of the body fetch() will hand out, or 0 when unknown. Content-Length counts
 *  *encoded* bytes when the server gzips; ember.web then sends X-Uncompressed-Length. */
function decodedLength(headers) {
  const encoded = (headers.get("Content-Encoding") || "identity") !== "identity";
  const n = encoded ? headers.get("X-Uncompressed-Length") : headers.get("Content-Length");
  return Number(n || 0);
}

/** Download `url` into a Uint8Array, reporting progress as the bytes arrive. */
export async function fetchBytes(url, { onProgress = null, label = null } = {}) {
  const resp = await fetch(url);
  if (!resp.ok) {
    throw new Error(`ember: download of ${url} failed: HTTP ${resp.status} ${resp.statusText}`);
  }
  const name = label || `Downloading ${url.split("?")[0].split("/").pop()}`;
  const total = decodedLength(resp.headers);
  const report = (loaded, done) => {
    if (onProgress) {
      onProgress({ fraction: done ? 1 : total ? clamp01(loaded / total) : 0,
                   label: name, loaded, total: done ? loaded : total });
    }
  };
  report(0, false);
  if (!resp.body) {   // very old engines: no streaming
    const buf = new Uint8Array(await resp.arrayBuffer());
    report(buf.length, true);
    return buf;
  }
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
  const out = new Uint8Array(loaded);
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.length;
  }
  report(loaded, true);
  return out;
}

/** `await ember.webgpu.init()` inside Pyodide; {ok, error} instead of throwing. */
export async function initWebGPU(pyodide) {
  if (!globalThis.navigator || !navigator.gpu) {
    return { ok: false, error: "this browser has no WebGPU (navigator.gpu is missing)" };
  }
  try {
    await pyodide.runPythonAsync("import ember.webgpu\nawait ember.webgpu.init()");
    return { ok: true, error: null };
  } catch (e) {
    return { ok: false, error: String(e && e.message ? e.message : e) };
  }
}

async function boot({ baseUrl, onProgress, webgpu }) {
  const t0 = performance.now();
  const base = withSlash(new URL(baseUrl || DEFAULT_BASE, globalThis.location?.href ?? DEFAULT_BASE).href);
  const progress = (fraction, label) => {
    if (onProgress) onProgress({ fraction, label, ms: performance.now() - t0 });
  };
  const timings = {};

  progress(0, "Loading Python runtime");
  const manifest = await readManifest(base);
  const indexURL = new URL("pyodide/", base).href;
  const { loadPyodide } = await import(new URL("pyodide.mjs", indexURL).href);
  // packages: [] and a local lock file: Pyodide never looks for a CDN.
  const pyodide = await loadPyodide({ indexURL, packages: [] });
  timings.pyodideReady = performance.now() - t0;
  progress(0.7, "Downloading ember");

  // The wheel's name carries its version; the ?v= hash makes a rebuilt wheel of the same
  // version a new URL, so the server may let browsers cache /wheels/ for a long time.
  const wheelUrl = new URL(manifest.wheel, base).href +
                   (manifest.wheel_sha256 ? `?v=${manifest.wheel_sha256.slice(0, 16)}` : "");
  const wheel = await fetchBytes(wheelUrl, {
    label: "Downloading ember",
    onProgress: (p) => progress(0.7 + 0.15 * p.fraction, "Downloading ember"),
  });
  progress(0.85, "Installing ember");
  const sitePackages = pyodide.runPython("import site; site.getsitepackages()[0]");
  pyodide.unpackArchive(wheel, "wheel", { extractDir: sitePackages });
  // Check the import here: a broken install must fail loudly at load time, not in a demo.
  try {
    pyodide.runPython("import importlib; importlib.invalidate_caches(); import ember");
  } catch (e) {
    throw new Error(`ember: the wheel ${manifest.wheel} installed but 'import ember' failed: ${e}`);
  }
  timings.emberImported = performance.now() - t0;
  const info = { version: pyodide.runPython("ember.__version__"), webgpu: false,
                 webgpuError: null, timings, manifest };

  if (webgpu) {
    progress(0.92, "Starting WebGPU");
    const r = await initWebGPU(pyodide);
    info.webgpu = r.ok;
    info.webgpuError = r.error;
    if (!r.ok && webgpu !== "auto") throw new Error(`ember: WebGPU did not start: ${r.error}`);
    timings.webgpuReady = performance.now() - t0;
  }
  pyodide.ember = info;
  progress(1, "Ready");
  return pyodide;
}

/** Boot Pyodide and install ember (once per page); see the API notes at the top. */
export async function loadEmber({ baseUrl = null, onProgress = null, webgpu = false } = {}) {
  if (!booting) {
    booting = boot({ baseUrl, onProgress, webgpu }).catch((e) => {
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
