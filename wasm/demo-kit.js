// demo-kit.js: page code the demos share (demos/*/demo.js): the loading bar, the error and
// "no WebGPU" notices, the backend radio buttons, and loading a demo's Python files.
//
// Served at /wasm/demo-kit.js next to the loader; a demo imports it as "../../wasm/demo-kit.js"
// and links /wasm/demo.css for the look the pages share. The page provides these ids:
// progress-bar, progress-label, loading, app, notice, error, backend-webgpu, backend-cpu,
// backend-name; the radio buttons are named "backend" with values "webgpu" and "cpu".

export const $ = (id) => document.getElementById(id);

/** The loading bar. `bar(extra, label)` repaints it; `bar.boot` is loadEmber's onProgress and
 *  `bar.weights(fraction, label)` reports the weights' download. The shares say how much of the
 *  bar each part fills; `extra` adds the page's own steps after both. */
export function progressBar(bootShare, weightsShare) {
  let bootFrac = 0, weightsFrac = 0, bootLabel = "Starting", weightsLabel = "";
  const bar = (extra = 0, label = null) => {
    const f = bootShare * bootFrac + weightsShare * weightsFrac + extra;
    $("progress-bar").style.width = `${(100 * Math.min(1, f)).toFixed(1)}%`;
    $("progress-label").textContent = label || [bootLabel, weightsLabel].filter(Boolean).join(" · ");
  };
  bar.boot = (p) => { bootFrac = p.fraction; bootLabel = p.label; bar(); };
  bar.weights = (fraction, label) => { weightsFrac = fraction; weightsLabel = label; bar(); };
  return bar;
}

export function showError(e) {
  const el = $("error");
  el.hidden = false;
  el.textContent = `Something went wrong: ${e && e.message ? e.message : e}`;
  console.error(e);
}

/** The `.catch` of a page's start-up: say so on the page, and keep the promise rejected. */
export function loadFailed(e) {
  $("progress-label").textContent = "Loading failed";
  showError(e);
  throw e;
}

// ---- backends -------------------------------------------------------------------------------

/** Why `which` cannot run the model (a message), or null when it can. */
export function checkBackend(which, webgpuOk) {
  if (which !== "webgpu" && which !== "cpu") return `unknown backend ${which}: use "webgpu" or "cpu"`;
  if (which === "webgpu" && !webgpuOk) return 'WebGPU is not available in this browser; use backend "cpu"';
  return null;
}

/** Check the backend's radio button and name it after "Running on". */
export function showBackend(name) {
  $(`backend-${name}`).checked = true;
  $("backend-name").textContent = name === "webgpu" ? "WebGPU" : "CPU (pure Python)";
}

/** Record in `info` (the page's copy of pyodide.ember) that the model cannot use WebGPU. */
export function webgpuFailed(info, what, e, demo) {
  info.webgpu = false;
  info.webgpuError = `${what}: ${String(e && e.message ? e.message : e).trim().split("\n").pop()}`;
  console.warn(`${demo} demo: WebGPU failed, using the CPU:`, e);
}

/** Once loaded: without WebGPU say why (`fallback` says what the page does instead) and grey its
 *  radio button out; wire the radio buttons to `setBackend` and select the best backend. */
export function offerBackends(info, webgpuOk, fallback, setBackend) {
  if (!webgpuOk) {
    const why = info.webgpuError || "navigator.gpu is missing";
    const n = $("notice");
    n.hidden = false;
    n.textContent = `WebGPU is not available here: ${why.replace(/\.$/, "")}. ${fallback}`;
    $("backend-webgpu").disabled = true;
    $("backend-webgpu").parentElement.classList.add("unavailable");
  }
  for (const r of document.querySelectorAll('input[name="backend"]')) {
    r.addEventListener("change", () => { if (r.checked) setBackend(r.value); });
  }
  setBackend(webgpuOk ? "webgpu" : "cpu");
}

/** Hide the loading bar and enable the page. */
export function pageReady() {
  $("loading").hidden = true;
  $("app").classList.remove("disabled");
}

// ---- Python ---------------------------------------------------------------------------------

/** Fetch the page's Python files (next to the page) into `dir` and import its app.py:
 *  returns the `app` module (a PyProxy: destroy it when done). */
export async function loadApp(pyodide, dir, files) {
  pyodide.FS.mkdirTree(dir);
  await Promise.all(files.map(async (name) => {
    const resp = await fetch(name);
    if (!resp.ok) throw new Error(`cannot fetch ${name}: HTTP ${resp.status}`);
    pyodide.FS.writeFile(`${dir}/${name}`, await resp.text());
  }));
  return pyodide.runPython(`
import sys
if ${JSON.stringify(dir)} not in sys.path:
    sys.path.insert(0, ${JSON.stringify(dir)})
import app
app`);
}

/** A Python dict result as a JS object (the proxy is destroyed). */
export function pyObject(res) {
  const obj = res.toJs({ dict_converter: Object.fromEntries });
  res.destroy();
  return obj;
}

let queue = Promise.resolve();

/** Run `fn` (async) after the calls queued before it: the page has one Python interpreter. */
export function serially(fn) {
  const p = queue.then(fn, fn);
  queue = p.catch(() => {});
  return p;
}
