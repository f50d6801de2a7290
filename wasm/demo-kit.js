// demo-kit.js: page code the demos share (demos/*/demo.js): the loading bar, the error and
// WebGPU notices, the backend radio buttons, starting the demo's Python in the ember Worker and
// switching to WebGPU once it is warm.
//
// Served at /wasm/demo-kit.js next to the loader; a demo imports it as "../../wasm/demo-kit.js"
// and links /wasm/demo.css for the look the pages share. The page provides these ids:
// progress-bar, progress-label, loading, app, notice, error, backend-webgpu, backend-cpu,
// backend-python (its label: python-choice), cpu-label, webgpu-state, backend-name; the radio
// buttons are named "backend" with values "webgpu", "cpu" and "python".
//
// Backends: a page offers "webgpu", "cpu" and "python". Each demo's app.py maps them to ember
// devices: "cpu" is "wasm" (WebAssembly SIMD kernels) where ember has that backend, else
// "python"; "python" is always the pure-Python backend (for comparison).
//
// Exports:
//   $(id), progressBar(bootShare, weightsShare), showError(e), clearError(), inputError(msg),
//   loadFailed(e), BACKENDS, DEVICE_LABELS, Backends (the page's backend state, below),
//   startApp(worker, dir, urls), pageReady(), serially(fn)

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

// ---- errors -------------------------------------------------------------------------------------

/** An error about what the user (or the caller of the page's API) gave: shown as it is. */
export function inputError(message) {
  return Object.assign(new Error(message), { name: "InputError" });
}

/** {width, height, rgba: Uint8Array} of an encoded image (a Blob, or its bytes as a Uint8Array)
 *  decoded by the browser; an InputError when it is empty, larger than `maxBytes` or `maxPixels`,
 *  or not an image the browser can decode. */
export async function decodeImage(image, { maxBytes, maxPixels }) {
  const blob = image instanceof Uint8Array ? new Blob([image]) : image;
  if (!(blob instanceof Blob)) throw inputError("give the image as a Blob (a File) or its bytes as a Uint8Array");
  if (blob.size === 0) throw inputError("the file is empty");
  if (blob.size > maxBytes) throw inputError(`the file is too large (${(blob.size / 1e6).toFixed(0)} MB; at most ${maxBytes / 1e6} MB)`);
  let bitmap;
  try {
    bitmap = await createImageBitmap(blob);
  } catch (e) {
    throw inputError("this is not an image the browser can decode (PNG, JPEG, WebP, GIF or BMP), or the file is truncated");
  }
  const { width, height } = bitmap;
  if (!width || !height) throw inputError("the image has no pixels");
  if (width * height > maxPixels) {
    bitmap.close();
    throw inputError(`the image is too large (${width}×${height}; at most ${maxPixels / 1e6} megapixels)`);
  }
  const canvas = new OffscreenCanvas(width, height);
  const ctx = canvas.getContext("2d", { willReadFrequently: true });
  ctx.drawImage(bitmap, 0, 0);
  bitmap.close();
  return { width, height, rgba: new Uint8Array(ctx.getImageData(0, 0, width, height).data.buffer) };
}

/** True for errors that describe bad input rather than a failure of the page. */
function isInputError(e) {
  return !!e && (e.name === "InputError" || e.pythonType === "ValueError" || e.pythonType === "TypeError");
}

/** Show `e` on the page: input errors as their message; anything else as a failure, with the
 *  Python traceback folded away underneath when there is one. */
export function showError(e) {
  const el = $("error");
  el.hidden = false;
  el.replaceChildren();
  const msg = e && e.pythonMessage != null ? e.pythonMessage : String(e && e.message ? e.message : e);
  if (isInputError(e)) {
    el.classList.add("input");
    el.textContent = msg;
    return;
  }
  el.classList.remove("input");
  const what = e && e.pythonType ? `${e.pythonType}: ${msg}` : msg;
  el.append(`Something went wrong: ${what}`);
  if (e && e.traceback) {
    const d = document.createElement("details");
    const s = document.createElement("summary");
    s.textContent = "Python traceback";
    const pre = document.createElement("pre");
    pre.textContent = e.traceback;
    d.append(s, pre);
    el.append(d);
  }
  console.error(e);
}

export function clearError() {
  $("error").hidden = true;
}

/** The `.catch` of a page's start-up: say so on the page, and keep the promise rejected. */
export function loadFailed(e) {
  $("progress-label").textContent = "Loading failed";
  showError(e);
  throw e;
}

// ---- backends -------------------------------------------------------------------------------

export const BACKENDS = ["webgpu", "cpu", "python", "server"];   // server: ember serve (build.py demo --remote)
export const DEVICE_LABELS = { webgpu: "WebGPU", wasm: "CPU (WebAssembly SIMD)", python: "CPU (pure Python)" };

/** The page's backends: which ones run now, which one is selected, the WebGPU start-up.
 *
 *  `devices` maps page backends to ember devices (app.py's DEVICES). WebGPU is off until
 *  `startWebGPU` has warmed it up; then the page switches to it unless the user picked a
 *  backend by hand meanwhile. `onChange(name)` runs when the selection changes. */
export class Backends {
  constructor({ devices, info, onChange, demo }) {
    this.devices = devices;
    this.info = info;
    this.onChange = onChange;
    this.demo = demo;
    this.webgpu = "starting";    // "starting" | "ready" | "failed"
    this.current = "cpu";
    this.picked = false;         // the user chose a backend with the radio buttons
    const cpuOnlyPython = devices.cpu === "python";
    $("cpu-label").textContent = DEVICE_LABELS[devices.cpu] || devices.cpu;
    // Without the wasm backend "cpu" is pure Python already: no need for a second button.
    $("python-choice").hidden = cpuOnlyPython;
    $("backend-webgpu").disabled = true;
    $("webgpu-state").textContent = "(starting…)";
    for (const r of document.querySelectorAll('input[name="backend"]')) {
      r.addEventListener("change", () => {
        if (!r.checked) return;
        this.picked = true;
        this.select(r.value);
      });
    }
    this.select("cpu");
  }

  /** The device label of a page backend ("CPU (WebAssembly SIMD)"...). */
  label(name) {
    if (name === "server") return this.serverLabel || "Server GPU";
    return DEVICE_LABELS[this.devices[name]] || name;
  }

  /** The page's site was started with a server (``build.py demo --remote URL``, its
   *  ``remote.json``): `start()` connects the worker to it and warms the model up there; then
   *  "server" can be picked, labelled with where the work runs. Resolves to {ok, error, info}. */
  async startServer(start) {
    const cfg = await fetch(new URL("/remote.json", location.href), { cache: "no-store" }).then((r) => (r.ok ? r.json() : null)).catch(() => null);
    if (!cfg || !cfg.url) return { ok: false, error: "no server", info: null };
    $("server-choice").hidden = false;
    $("server-state").textContent = "(connecting…)";
    try {
      const info = await start(cfg.url, cfg.token || "");
      this.devices.server = "remote";
      this.serverLabel = `Server GPU (${info.server_device} at ${cfg.url})`;
      this.info.server = info;
      $("server-label").textContent = this.serverLabel;
      $("server-state").textContent = "";
      $("backend-server").disabled = false;
      return { ok: true, error: null, info };
    } catch (e) {
      const error = String(e.pythonMessage || e.message || e).trim().split("\n").pop();
      this.info.serverError = error;
      $("server-state").textContent = `(not available: ${error})`;
      $("server-choice").classList.add("unavailable");
      return { ok: false, error, info: null };
    }
  }

  /** Why `which` cannot run the model now (a message), or null when it can. */
  check(which) {
    if (!BACKENDS.includes(which)) return `unknown backend ${JSON.stringify(which)}: use "webgpu", "cpu", "python" or "server"`;
    if (which === "webgpu" && this.webgpu === "starting") {
      return 'WebGPU is still starting (compiling its kernels); use backend "cpu" or await emberDemo.webgpuReady';
    }
    if (which === "webgpu" && this.webgpu === "failed") return 'WebGPU is not available in this browser; use backend "cpu"';
    if (which === "server" && !this.devices.server) {
      return 'no server backend: start the site with build.py demo --remote URL (and wait for emberDemo.serverReady)';
    }
    return null;
  }

  select(name) {
    const bad = this.check(name);
    if (bad) throw inputError(bad);
    this.current = name;
    $(`backend-${name}`).checked = true;
    $("backend-name").textContent = this.label(name);
    if (this.onChange) this.onChange(name);
  }

  /** Start WebGPU in the worker, then `warm()` (the demo puts its model on the GPU and runs it
   *  once); on success switch to it and say so. Resolves to {ok, error, ms}. */
  async startWebGPU(worker, warm, t0) {
    const started = performance.now();
    let error = null;
    const r = await worker.initWebGPU().catch((e) => ({ ok: false, error: e.message || String(e) }));
    if (!r.ok) error = r.error || "navigator.gpu is missing";
    let warmInfo = null;
    if (!error) {
      $("webgpu-state").textContent = "(compiling kernels…)";
      try {
        warmInfo = await warm();
      } catch (e) {
        error = `the model failed on WebGPU: ${e.pythonMessage || e.message || e}`;
        console.warn(`${this.demo} demo: WebGPU failed, staying on the CPU:`, e);
      }
    }
    const n = $("notice");
    n.hidden = false;
    const ms = performance.now() - started;
    if (error) {
      this.webgpu = "failed";
      this.info.webgpu = false;
      this.info.webgpuError = String(error).trim().split("\n").pop();
      n.dataset.kind = "no-webgpu";
      n.textContent = `WebGPU is not available here: ${this.info.webgpuError.replace(/\.$/, "")}. ` +
                      `The model keeps running on the ${this.label("cpu")}: same answers.`;
      $("backend-webgpu").parentElement.classList.add("unavailable");
      $("webgpu-state").textContent = "(not available)";
      return { ok: false, error: this.info.webgpuError, ms };
    }
    this.webgpu = "ready";
    if (worker.onWebGPULost) worker.onWebGPULost((reason) => this.lost(reason));
    this.info.webgpu = true;
    this.info.webgpuError = null;
    this.info.webgpuReadyMs = performance.now() - t0;
    this.info.webgpuWarm = warmInfo;
    $("backend-webgpu").disabled = false;
    $("webgpu-state").textContent = "";
    n.dataset.kind = "webgpu-ready";
    const switched = !this.picked;
    n.textContent = `WebGPU is ready (its kernels compiled in ${(ms / 1000).toFixed(1)} s while the page ` +
                    `answered on the ${this.label("cpu")})` +
                    (switched ? ": now running on WebGPU." : "; pick it under Backend.") +
                    // SwiftShader and the like emulate a GPU on the CPU: say so, the user may want the CPU.
                    (warmInfo && warmInfo.fallback_adapter && this.devices.cpu === "wasm"
                      ? ` This browser's WebGPU is a software fallback adapter: the ${this.label("cpu")} ` +
                        "backend may well be faster here." : "");
    if (switched) this.select("webgpu");
    return { ok: true, error: null, ms };
  }

  /** The GPU device was lost after WebGPU started (GPUDevice.lost, or a call failed with ember's
   *  DeviceLostError): say so, turn the WebGPU choice off and go on on the CPU. */
  lost(reason) {
    if (this.webgpu === "failed") return;
    this.webgpu = "failed";
    this.info.webgpu = false;
    this.info.webgpuError = String(reason || "the GPU device was lost").trim().split("\n").pop();
    const n = $("notice");
    n.hidden = false;
    n.dataset.kind = "webgpu-lost";
    n.textContent = `WebGPU stopped: ${this.info.webgpuError.replace(/\.$/, "")}. ` +
                    `The model now runs on the ${this.label("cpu")}: same answers.`;
    $("backend-webgpu").disabled = true;
    $("backend-webgpu").parentElement.classList.add("unavailable");
    $("webgpu-state").textContent = "(lost)";
    if (this.current === "webgpu") this.select("cpu");
  }

  /** True (after switching the page to the CPU) when `e` says the GPU device was lost. */
  recover(e) {
    const lost = !!e && (e.pythonType === "DeviceLostError" || /device was lost/i.test(String(e.message || "")));
    if (lost) this.lost(e.pythonMessage || e.message);
    return lost;
  }
}

// ---- the page ---------------------------------------------------------------------------------

/** Hide the loading bar and enable the page. */
export function pageReady() {
  $("loading").hidden = true;
  $("app").classList.remove("disabled");
}

/** Fetch the page's Python files (URLs next to the page) into `dir` in the worker and import
 *  its app.py; returns app.DEVICES ({cpu, webgpu, python} -> ember device). */
export async function startApp(worker, dir, urls) {
  await worker.loadFiles(dir, urls);
  return await worker.runPython("import app\ndict(app.DEVICES)");
}

let queue = Promise.resolve();

/** Run `fn` (async) after the calls queued before it: the page's model runs one call at a time. */
export function serially(fn) {
  const p = queue.then(fn, fn);
  queue = p.catch(() => {});
  return p;
}
