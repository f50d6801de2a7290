// The classify page: loading (ember's Worker, the EfficientNet-Lite0 checkpoint), decoding the
// user's image in the browser (canvas -> RGBA), showing the top 5, and the bridge to app.py,
// which runs in the worker (Pyodide never runs on this thread).
//
// JS API (for tests and for pages that embed the demo):
//   window.emberDemo.ready                       Promise, resolves (to .info) when the model
//                                                answers on the CPU; WebGPU starts after that
//   window.emberDemo.webgpuReady                 Promise -> {ok, error, ms} once WebGPU is warm
//                                                (the page then switches to it) or has failed
//   await window.emberDemo.classify(image, backend)
//        image: an ImageData, a Blob (a File: PNG, JPEG, WebP... anything the browser decodes)
//               or a URL (string or URL object) of such a file
//        backend: "cpu" (ember's WebAssembly SIMD backend) | "webgpu" (waits for WebGPU to be
//               warm if it is still starting) | "python" (pure Python, very slow); default: the
//               one selected on the page
//        -> {top5: [{label, index, prob}], ms, backend}: the five most probable ImageNet
//           classes (softmax probabilities), the whole call's time in ms (decoding,
//           preprocessing, the network, reading back), the backend that ran it
//   await window.emberDemo.show(image)           same as dropping the image on the page -> result
//   await window.emberDemo.loadOnnx(bytes, name) use an ONNX ImageNet classifier instead
//        (input (N, 3, S, S) normalised with ImageNet's mean/std, output (N, 1000) logits)
//   await window.emberDemo.useBuiltin()          back to EfficientNet-Lite0
//   window.emberDemo.setBackend(name)            same as clicking the radio button
//   window.emberDemo.lastResult                  the last result shown, with timings {decode,
//                                                preprocess, model} and the model's name
//   window.emberDemo.info                        {webgpu, webgpuError, webgpuReadyMs, devices,
//                                                readyMs, loadMs, weightsCached, ...}
//   window.emberDemo.worker                      the EmberWorker (see /wasm/ember.js)

import { loadEmber } from "../../wasm/ember.js";
import { $, progressBar, showError, clearError, inputError, loadFailed, Backends, pageReady, startApp,
         serially, decodeImage as decodeImageBytes } from "../../wasm/demo-kit.js";

const PY_DIR = "/home/pyodide/classify";
const WEIGHTS = "efficientnet-lite0-57934424.pth";
const WEIGHTS_BYTES = 18826032;
const PY_FILES = ["app.py"];
const SAMPLES = ["chelsea.jpg", "coffee.jpg", "rocket.jpg"];
const MAX_PIXELS = 50e6;
const MAX_BYTES = 100e6;

let worker = null;
let backends = null;
let shownUrl = null;
let lastImage = null;

// ---- decoding (in the browser) ------------------------------------------------------------

/** {width, height, rgba: Uint8Array} of an ImageData, a Blob or a URL; an InputError when it is
 *  none of these or not an image the browser can decode. */
async function decodeImage(image) {
  if (typeof ImageData !== "undefined" && image instanceof ImageData) {
    if (!image.width || !image.height) throw inputError("the ImageData has no pixels");
    // a copy: the caller keeps its ImageData, ours is transferred to the worker
    return { width: image.width, height: image.height, rgba: new Uint8Array(image.data) };
  }
  if (typeof image === "string" || image instanceof URL) {
    let resp;
    try {
      resp = await fetch(image);
    } catch (e) {
      throw inputError(`could not fetch the image at ${image}: ${e.message || e}`);
    }
    if (!resp.ok) throw inputError(`could not fetch the image at ${image}: HTTP ${resp.status}`);
    image = await resp.blob();
  }
  if (!(image instanceof Blob)) throw inputError("classify: give an ImageData, a Blob (a File) or an image's URL");
  return decodeImageBytes(image, { maxBytes: MAX_BYTES, maxPixels: MAX_PIXELS });
}

// ---- the model ----------------------------------------------------------------------------

async function checkBackend(which) {
  if (!backends) throw inputError("the model is not loaded yet: await emberDemo.ready");
  if (which === "webgpu" && backends.webgpu === "starting") await window.emberDemo.webgpuReady;
  const bad = backends.check(which);
  if (bad) throw inputError(bad);
}

/** The detailed result of classifying `image` through app.py in the worker (one call at a time). */
async function classifyDetailed(image, which = backends ? backends.current : "cpu") {
  await checkBackend(which);
  return serially(async () => {
    const t0 = performance.now();
    const img = await decodeImage(image);
    const decodeMs = performance.now() - t0;
    let r;
    try {
      r = await worker.call("app", "classify", [img.width, img.height, img.rgba, which], { transfer: [img.rgba.buffer] });
    } catch (e) {
      if (which === "webgpu" && backends.recover(e)) throw inputError("WebGPU stopped; the page is back on the CPU: try again");
      throw e;
    }
    const ms = performance.now() - t0;
    return { top5: r.top5, ms, backend: r.backend, device: r.device, model: r.model,
             width: img.width, height: img.height, timings: { decode: decodeMs, ...r.timings, total: ms } };
  });
}

async function classify(image, which) {
  const r = await classifyDetailed(image, which);
  return { top5: r.top5.map((t) => ({ label: t.label, index: t.index, prob: t.prob })), ms: r.ms, backend: r.backend };
}

// ---- the page -----------------------------------------------------------------------------

function showResult(r) {
  window.emberDemo.lastResult = r;
  const ol = $("top5");
  ol.replaceChildren();
  for (const t of r.top5) {
    const li = document.createElement("li");
    const label = document.createElement("span");
    label.className = "label";
    label.textContent = t.label;
    const prob = document.createElement("span");
    prob.className = "prob";
    prob.textContent = `${(100 * t.prob).toFixed(1)}%`;
    const bar = document.createElement("div");
    bar.className = "bar";
    bar.style.width = `${Math.max(1, 100 * t.prob).toFixed(1)}%`;
    li.append(label, prob, bar);
    li.dataset.index = t.index;
    ol.append(li);
  }
  $("ms").textContent = r.ms.toFixed(0);
  $("backend-name").textContent = backends.label(r.backend);
  $("model-name").textContent = r.model;
  const tb = $("timings").querySelector("tbody");
  tb.replaceChildren();
  for (const [k, v] of Object.entries(r.timings)) {
    const tr = document.createElement("tr");
    tr.className = k;
    tr.innerHTML = `<td>${k}</td><td>${v.toFixed(0)}</td>`;
    tb.append(tr);
  }
}

function showPicture(image) {
  if (shownUrl) URL.revokeObjectURL(shownUrl);
  shownUrl = null;
  if (image instanceof Blob) {
    shownUrl = URL.createObjectURL(image);
    $("picture").src = shownUrl;
  } else if (typeof image === "string" || image instanceof URL) {
    $("picture").src = String(image);
  } else if (typeof ImageData !== "undefined" && image instanceof ImageData) {
    const c = document.createElement("canvas");
    c.width = image.width;
    c.height = image.height;
    c.getContext("2d").putImageData(image, 0, 0);
    $("picture").src = c.toDataURL();
  }
  $("placeholder").hidden = true;
  $("top5").replaceChildren();
}

async function show(image) {
  lastImage = image;
  showPicture(image);
  clearError();
  $("busy").hidden = false;
  $("busy").textContent = `classifying on the ${backends.label(backends.current)}…`;
  try {
    const r = await classifyDetailed(image, backends.current);
    showResult(r);
    return r;
  } finally {
    $("busy").hidden = true;
  }
}

async function loadOnnx(bytes, name = "model.onnx") {
  if (!backends) throw inputError("the model is not loaded yet: await emberDemo.ready");
  if (bytes instanceof Blob) bytes = new Uint8Array(await bytes.arrayBuffer());
  if (!(bytes instanceof Uint8Array)) throw inputError("loadOnnx: give the file's bytes (a Uint8Array or a Blob)");
  const info = await serially(() => worker.call("app", "load_onnx", [bytes, name]));
  $("model-name").textContent = info.name;
  $("builtin").hidden = false;
  window.emberDemo.info.onnx = info;
  return info;
}

async function useBuiltin() {
  await serially(() => worker.call("app", "use_builtin"));
  $("model-name").textContent = "EfficientNet-Lite0";
  $("builtin").hidden = true;
  window.emberDemo.info.onnx = null;
}

/** A file from the user: an .onnx model replaces the classifier (and the last image is
 *  classified again), anything else is an image to classify. */
async function takeFile(f) {
  if (!f) return;
  try {
    if (/\.onnx$/i.test(f.name || "")) {
      clearError();
      $("busy").hidden = false;
      $("busy").textContent = `loading ${f.name}…`;
      try {
        await loadOnnx(f, f.name);
      } finally {
        $("busy").hidden = true;
      }
      if (lastImage) await show(lastImage);
      return;
    }
    await show(f);
  } catch (e) {
    showError(e);
  }
}

function setBackend(name) {
  if (!backends) throw inputError("the model is not loaded yet: await emberDemo.ready");
  backends.select(name);
}

function setupInputs() {
  const box = $("samples");
  for (const name of SAMPLES) {
    const btn = document.createElement("button");
    btn.type = "button";
    btn.title = `sample: ${name}`;
    btn.dataset.sample = name;
    const img = document.createElement("img");
    img.src = `samples/${name}`;
    img.alt = name;
    btn.append(img);
    btn.addEventListener("click", () => show(new URL(`samples/${name}`, location.href).href).catch(showError));
    box.append(btn);
  }
  $("file").addEventListener("change", (e) => takeFile(e.target.files[0]));
  const stage = $("stage");
  stage.addEventListener("dragover", (e) => { e.preventDefault(); stage.classList.add("over"); });
  stage.addEventListener("dragleave", () => stage.classList.remove("over"));
  stage.addEventListener("drop", (e) => {
    e.preventDefault();
    stage.classList.remove("over");
    takeFile(e.dataTransfer.files[0]);
  });
  document.addEventListener("paste", (e) => {
    const items = [...(e.clipboardData ? e.clipboardData.items : [])];
    const item = items.find((i) => i.kind === "file");
    if (item) {
      e.preventDefault();
      takeFile(item.getAsFile());
    }
  });
  $("builtin").addEventListener("click", () => useBuiltin().then(() => lastImage && show(lastImage)).catch(showError));
}

// ---- loading ------------------------------------------------------------------------------

async function main() {
  const t0 = performance.now();
  const MB = 1e6;
  const bar = progressBar(0.5, 0.4);
  setupInputs();
  const weightsUrl = new URL(WEIGHTS, location.href).href;
  const onDownload = (p) => {
    if (p.url !== weightsUrl) return;
    bar.weights(p.fraction || 0, p.cached ? "weights (cached)"
      : `weights ${((p.loaded || 0) / MB).toFixed(1)} / ${((p.total || WEIGHTS_BYTES) / MB).toFixed(1)} MB`);
  };
  worker = await loadEmber({ worker: true, onProgress: bar.boot, prefetch: [weightsUrl, ...PY_FILES], onDownload });
  const info = { ...worker.info, webgpu: false, webgpuError: null, onnx: null };
  window.emberDemo.info = info;
  window.emberDemo.worker = worker;

  bar(0.02, "Loading the model");
  const [devices, file] = await Promise.all([
    startApp(worker, PY_DIR, PY_FILES),
    worker.fetchFile(weightsUrl, `${PY_DIR}/${WEIGHTS}`),
  ]);
  const loaded = await worker.call("app", "load", [`${PY_DIR}/${WEIGHTS}`]);
  info.loadMs = loaded.load_ms;
  info.devices = loaded.devices;
  info.weightsCached = file.cached;

  backends = new Backends({ devices, info, demo: "classify",
                            onChange: () => { if (lastImage && !window.emberDemo.busyExternally) show(lastImage).catch(showError); } });
  bar(0.1, "Ready");
  pageReady();
  info.readyMs = performance.now() - t0;
  $("model-info").textContent =
    `EfficientNet-Lite0: ${loaded.tensors} tensors, ${(WEIGHTS_BYTES / MB).toFixed(1)} MB PyTorch checkpoint` +
    `${info.weightsCached ? " (from the browser's cache)" : ""}, ${loaded.classes} classes; ready in ${(info.readyMs / 1000).toFixed(1)} s.`;

  // WebGPU in the background; on a software adapter (SwiftShader...) the page stays on the CPU,
  // which is faster there, and offers WebGPU under Backend.
  backends.startWebGPU(worker, async () => {
    const w = await worker.call("app", "start_webgpu");
    if (w.fallback_adapter) backends.picked = true;
    return w;
  }, t0).then(webgpuDone);
  return info;
}

let webgpuDone;
window.emberDemo = {
  classify,
  classifyDetailed,
  show,
  loadOnnx,
  useBuiltin,
  setBackend,
  lastResult: null,
  info: null,
  worker: null,
  webgpuReady: new Promise((resolve) => { webgpuDone = resolve; }),
};
window.emberDemo.ready = main().catch((e) => {
  webgpuDone({ ok: false, error: `the page did not load: ${e.message || e}`, ms: 0 });
  return loadFailed(e);
});
