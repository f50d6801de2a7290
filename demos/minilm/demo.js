// The MiniLM page: loading (Pyodide, ember, the weights), the compare UI, and the bridge to app.py.
//
// JS API (for tests and for pages that embed the demo):
//   window.emberMiniLM.ready                       Promise, resolves (to .info) when the model is loaded
//   await window.emberMiniLM.embed(sentences, backend)
//        sentences: 1..64 strings; backend: "webgpu" | "cpu" (default: the one selected on the page)
//        -> {embeddings (one list of 384 numbers per sentence, unit length), ms, backend,
//            tokenizeMs, embedMs, tokens (count per sentence, with [CLS] and [SEP])}
//   await window.emberMiniLM.compare()             same as pressing "Compare"; -> lastResult
//   window.emberMiniLM.setBackend(name)            same as clicking the radio button
//   window.emberMiniLM.lastResult                  {query, ranking: [{text, score}], ...timings}
//   window.emberMiniLM.info                        {webgpu, webgpuError, timings, steps, readyMs, ...}

import { loadEmber, fetchBytes } from "../../wasm/ember.js";
import { $, progressBar, showError, loadFailed, checkBackend, showBackend, webgpuFailed, offerBackends,
         pageReady, loadApp, pyObject, serially } from "../../wasm/demo-kit.js";

const PY_DIR = "/home/pyodide/minilm";
const WEIGHTS = "minilm-l6-v2.f16.safetensors";
const MAX_SENTENCES = 64;
const EXAMPLES = {
  query: "How do I bake bread at home?",
  candidates: [
    "The stock market fell sharply on Monday.",
    "A simple recipe for homemade sourdough loaves.",
    "My cat likes to sleep on the sofa.",
    "Tips for kneading dough and letting it rise.",
    "The football match ended in a draw.",
    "Quantum computers use qubits instead of bits.",
  ],
};

let pyodide = null;
let pyEmbed = null;        // app.embed (a PyProxy)
let webgpuOk = false;
let backend = "cpu";

// ---- weights: float16 on the wire, float32 for the model --------------------------------------

/** float16 bit pattern -> value, for all 65536 patterns (one lookup per weight afterwards). */
function halfTable() {
  const t = new Float32Array(65536);
  for (let h = 0; h < 65536; h++) {
    const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 31, m = h & 1023;
    t[h] = e === 0 ? s * m * 2 ** -24
         : e === 31 ? (m ? NaN : s * Infinity)
         : s * 2 ** (e - 15) * (1 + m / 1024);
  }
  return t;
}

/** A safetensors file with every F16 tensor rewritten as F32 (same names, shapes, order).
 *  Done here because it is a table lookup per value in JS and a Python loop per value in Pyodide. */
function widenSafetensors(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const n = Number(view.getBigUint64(0, true));
  if (n <= 0 || 8 + n > bytes.length) throw new Error(`${WEIGHTS}: not a safetensors file (header length ${n})`);
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + n)));
  const names = Object.keys(header).filter((k) => k !== "__metadata__")
    .sort((a, b) => header[a].data_offsets[0] - header[b].data_offsets[0]);
  const out = {};
  if (header.__metadata__) out.__metadata__ = header.__metadata__;
  let pos = 0;
  for (const k of names) {
    const e = header[k];
    const size = e.data_offsets[1] - e.data_offsets[0];
    const newSize = e.dtype === "F16" ? size * 2 : size;
    out[k] = { dtype: e.dtype === "F16" ? "F32" : e.dtype, shape: e.shape, data_offsets: [pos, pos + newSize] };
    pos += newSize;
  }
  let text = new TextEncoder().encode(JSON.stringify(out));
  const padded = new Uint8Array(Math.ceil(text.length / 8) * 8).fill(0x20);
  padded.set(text);
  text = padded;
  const result = new Uint8Array(8 + text.length + pos);
  new DataView(result.buffer).setBigUint64(0, BigInt(text.length), true);
  result.set(text, 8);
  const base = 8 + text.length, src0 = 8 + n;
  const table = halfTable();
  for (const k of names) {
    const [b, e] = header[k].data_offsets;
    const src = bytes.subarray(src0 + b, src0 + e);
    const at = base + out[k].data_offsets[0];
    if (header[k].dtype !== "F16") {
      result.set(src, at);
      continue;
    }
    // Uint16Array needs an even byte offset; copy the slice when it is not.
    const aligned = (bytes.byteOffset + src0 + b) % 2 === 0 ? src : src.slice();
    const halves = new Uint16Array(aligned.buffer, aligned.byteOffset, aligned.length / 2);
    const floats = new Float32Array(result.buffer, at, halves.length);
    for (let i = 0; i < halves.length; i++) floats[i] = table[halves[i]];
  }
  return result;
}

// ---- the model ------------------------------------------------------------------------------

/** Embed sentences through app.py; calls are queued (Pyodide runs one at a time). */
function embed(sentences, which = backend) {
  if (!pyEmbed) return Promise.reject(new Error("the model is not loaded yet: await emberMiniLM.ready"));
  const bad = checkBackend(which, webgpuOk);
  if (bad) return Promise.reject(new Error(bad));
  if (!Array.isArray(sentences) || sentences.length < 1 || sentences.length > MAX_SENTENCES) {
    return Promise.reject(new Error(`embed: give an array of 1 to ${MAX_SENTENCES} sentences`));
  }
  if (!sentences.every((s) => typeof s === "string")) {
    return Promise.reject(new Error("embed: every sentence must be a string"));
  }
  const run = async () => {
    const t0 = performance.now();
    const res = await pyEmbed(sentences, which);
    const ms = performance.now() - t0;
    const obj = pyObject(res);
    return { embeddings: obj.embeddings, ms, backend: obj.backend, tokenizeMs: obj.tokenize_ms,
             embedMs: obj.embed_ms, tokens: obj.tokens };
  };
  return serially(run);
}

const dot = (a, b) => a.reduce((s, v, i) => s + v * b[i], 0);

// ---- the page -------------------------------------------------------------------------------

function candidates() {
  return $("candidates").value.split("\n").map((s) => s.trim()).filter(Boolean);
}

function showRanking(r) {
  const ol = $("ranking");
  ol.replaceChildren();
  r.ranking.forEach((c, i) => {
    const li = document.createElement("li");
    li.classList.toggle("top", i === 0);
    const text = document.createElement("span");
    text.className = "text";
    text.textContent = c.text;
    const bar = document.createElement("div");
    bar.className = "bar";
    const fill = document.createElement("div");
    fill.className = "fill";
    fill.style.width = `${(100 * Math.max(0, c.score)).toFixed(1)}%`;
    bar.append(fill);
    const score = document.createElement("span");
    score.className = "score";
    score.textContent = c.score.toFixed(3);
    li.append(text, bar, score);
    ol.append(li);
  });
  const n = r.ranking.length + 1;
  $("tokenize-ms").textContent = `${r.tokenizeMs.toFixed(1)} ms`;
  $("embed-ms").textContent = `${r.embedMs.toFixed(0)} ms`;
  $("per-sentence-ms").textContent = `${(r.embedMs / n).toFixed(0)} ms`;
  $("n-tokens").textContent = String(r.tokens.reduce((a, b) => a + b, 0));
}

async function compare() {
  const query = $("query").value.trim();
  const cands = candidates();
  if (!query) throw new Error("type a sentence to compare against");
  if (!cands.length) throw new Error("give at least one candidate (one per line)");
  if (cands.length + 1 > MAX_SENTENCES) throw new Error(`at most ${MAX_SENTENCES - 1} candidates`);
  $("compare").disabled = true;
  $("busy").hidden = false;
  $("error").hidden = true;
  // Python runs on this thread and holds it until done: let "working…" paint first (the
  // timeout covers hidden tabs, where animation frames do not come).
  await new Promise((r) => { requestAnimationFrame(() => setTimeout(r, 0)); setTimeout(r, 100); });
  try {
    const r = await embed([query, ...cands], backend);
    const q = r.embeddings[0];
    const ranking = cands.map((text, i) => ({ text, score: dot(q, r.embeddings[i + 1]) }))
      .sort((a, b) => b.score - a.score);
    const result = { query, ranking, backend: r.backend, ms: r.ms, tokenizeMs: r.tokenizeMs,
                     embedMs: r.embedMs, tokens: r.tokens };
    window.emberMiniLM.lastResult = result;
    showRanking(result);
    return result;
  } finally {
    $("compare").disabled = false;
    $("busy").hidden = true;
  }
}

function setBackend(name) {
  const bad = checkBackend(name, webgpuOk);
  if (bad) throw new Error(bad);
  backend = name;
  showBackend(name);
  $("cpu-hint").hidden = name !== "cpu";
}

function resetExamples() {
  $("query").value = EXAMPLES.query;
  $("candidates").value = EXAMPLES.candidates.join("\n");
}

// ---- loading --------------------------------------------------------------------------------

async function main() {
  const t0 = performance.now();
  const MB = 1e6;
  const bar = progressBar(0.45, 0.35);
  resetExamples();
  $("examples").addEventListener("click", resetExamples);
  $("compare").addEventListener("click", () => compare().catch(showError));
  $("query").addEventListener("keydown", (e) => { if (e.key === "Enter") $("compare").click(); });

  // The weights (~43 MiB) download while Pyodide starts.
  const weights = fetchBytes(WEIGHTS, {
    onProgress: (p) => bar.weights(p.fraction, p.fraction >= 1 ? `weights ${(p.loaded / MB).toFixed(1)} MB`
      : `weights ${(p.loaded / MB).toFixed(1)} / ${p.total ? (p.total / MB).toFixed(1) : "?"} MB`),
  });
  const vocab = fetch("vocab.txt").then((r) => {
    if (!r.ok) throw new Error(`cannot fetch vocab.txt: HTTP ${r.status}`);
    return r.text();
  });
  pyodide = await loadEmber({ webgpu: "auto", onProgress: bar.boot });
  const info = { ...pyodide.ember };
  webgpuOk = !!info.webgpu;
  window.emberMiniLM.info = info;
  const steps = { emberReady: performance.now() - t0 };

  const half = await weights;
  steps.weightsDownloaded = performance.now() - t0;
  bar(0.03, "Widening the float16 weights to float32");
  await new Promise((r) => setTimeout(r, 0));   // let the label paint
  const full = widenSafetensors(half);
  steps.weightsWidened = performance.now() - t0;
  bar(0.05, webgpuOk ? "Loading the model (CPU and WebGPU)" : "Loading the model");
  await new Promise((r) => setTimeout(r, 0));
  const app = await loadApp(pyodide, PY_DIR, ["tokenizer.py", "model.py", "app.py"]);
  const backends = webgpuOk ? ["cpu", "webgpu"] : ["cpu"];
  const vocabText = await vocab;
  const load = (which) => pyObject(app.load(vocabText, full, which));
  let loaded;
  try {
    loaded = load(backends);
  } catch (e) {
    if (!webgpuOk) throw e;
    // The CPU model loaded first; a failure on the GPU side falls back to it.
    webgpuOk = false;
    webgpuFailed(info, "the model could not be put on WebGPU", e, "MiniLM");
    loaded = load(["cpu"]);
  }
  app.destroy();
  pyEmbed = pyodide.runPython("app.embed");   // its own proxy, kept for the page's life
  window.emberMiniLM.pyodide = pyodide;
  info.loadMs = loaded.load_ms;
  steps.modelLoaded = performance.now() - t0;

  if (webgpuOk) {
    // The first WebGPU call compiles the kernels: do it now, not on the user's first click.
    bar(0.08, "Compiling WebGPU kernels (first visit only takes this long)");
    try {
      await embed(["Warming up the kernels."], "webgpu");
    } catch (e) {
      webgpuOk = false;
      webgpuFailed(info, "the model failed on WebGPU", e, "MiniLM");
    }
    steps.webgpuWarm = performance.now() - t0;
  }
  offerBackends(info, webgpuOk,
                "The model runs on the CPU instead, in pure Python: same answers, a few seconds per sentence.",
                setBackend);

  bar(0.2, "Ready");
  pageReady();
  info.readyMs = performance.now() - t0;
  info.steps = steps;   // ms since this script started
  $("model-info").textContent =
    `Weights: ${(half.length / MB).toFixed(1)} MB (float16), ${loaded.vocab} WordPiece tokens; ` +
    `ready in ${(info.readyMs / 1000).toFixed(1)} s.`;
  return info;
}

window.emberMiniLM = {
  pyodide: null,   // the page's Pyodide, once ready (app.py is importable as "app")
  embed,
  compare,
  setBackend,
  lastResult: null,
  info: null,
};
window.emberMiniLM.ready = main().catch(loadFailed);
