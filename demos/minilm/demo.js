// The MiniLM page: loading (ember's Worker, the weights), the compare UI, and the bridge to
// app.py, which runs in the worker (Pyodide never runs on this thread).
//
// JS API (for tests and for pages that embed the demo; window.emberMiniLM is the same object):
//   window.emberDemo.ready                        Promise, resolves (to .info) when the model
//                                                 answers on the CPU; WebGPU starts after that
//   window.emberDemo.webgpuReady                  Promise -> {ok, error, ms} once WebGPU is warm
//                                                 (the page then switches to it) or has failed
//   await window.emberDemo.embed(sentences, backend, {signal, onProgress})
//        sentences: 1..64 strings; backend: "webgpu" | "cpu" | "python" (default: the one
//        selected on the page; "cpu" is ember's WebAssembly SIMD backend where it exists)
//        signal: an AbortSignal (the call rejects with an error named "AbortError" soon after
//        it fires); onProgress({fraction, label, done, total}) after each batch
//        -> {embeddings (one list of 384 numbers per sentence, unit length, mean-pooled),
//            ms, backend, device ("wasm" | "python" | "webgpu"), tokenizeMs, embedMs,
//            tokens (count per sentence, with [CLS] and [SEP]), cut (word pieces dropped past
//            maxTokens = 256, per sentence), unknown (per sentence: every word piece is [UNK])}
//   await window.emberDemo.compare()              same as pressing "Compare"; -> lastResult
//   window.emberDemo.cancel()                     same as pressing "Cancel" (stops compare())
//   window.emberDemo.setBackend(name)             same as clicking the radio button
//   window.emberDemo.lastResult                   {query, ranking: [{text, score}], ...timings}
//   window.emberDemo.info                         {webgpu, webgpuError, webgpuReadyMs, devices,
//                                                 timings, steps, readyMs, loadMs, ...}
//   window.emberDemo.worker                       the EmberWorker (see /wasm/ember.js)

import { loadEmber } from "../../wasm/ember.js";
import { $, progressBar, showError, clearError, inputError, loadFailed, Backends, pageReady, startApp,
         serially } from "../../wasm/demo-kit.js";

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

let worker = null;         // the EmberWorker running app.py
let backends = null;       // the page's backend state (demo-kit's Backends)
let running = null;        // the AbortController of the compare in progress

// ---- the model ------------------------------------------------------------------------------

/** Embed sentences through app.py in the worker; calls are queued (one at a time). */
function embed(sentences, which = backends ? backends.current : "cpu", { signal = null, onProgress = null } = {}) {
  if (!backends) return Promise.reject(inputError("the model is not loaded yet: await emberDemo.ready"));
  const bad = backends.check(which);
  if (bad) return Promise.reject(inputError(bad));
  if (!Array.isArray(sentences) || sentences.length < 1 || sentences.length > MAX_SENTENCES) {
    return Promise.reject(inputError(`embed: give an array of 1 to ${MAX_SENTENCES} sentences`));
  }
  if (!sentences.every((s) => typeof s === "string")) {
    return Promise.reject(inputError("embed: every sentence must be a string"));
  }
  return serially(async () => {
    const t0 = performance.now();
    const r = await worker.call("app", "embed", [sentences, which], { signal, onProgress });
    return { embeddings: r.embeddings, ms: performance.now() - t0, backend: r.backend, device: r.device,
             tokenizeMs: r.tokenize_ms, embedMs: r.embed_ms, tokens: r.tokens, cut: r.cut,
             unknown: r.unknown, maxTokens: r.max_tokens };
  });
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
    li.classList.toggle("unknown", !!c.unknown);
    const text = document.createElement("span");
    text.className = "text";
    text.textContent = c.text;
    if (c.unknown || c.cut) {
      const flag = document.createElement("span");
      flag.className = "flag";
      flag.textContent = c.unknown ? " (all [UNK]: no word the model knows)" : ` (cut: ${c.cut} word pieces past ${r.maxTokens} tokens ignored)`;
      text.append(flag);
    }
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
  // The timings belong to the backend that measured them, whatever is selected now.
  $("timed-on").textContent = backends.label(r.backend);
  showNotes(r);
  $("tokenize-ms").textContent = `${r.tokenizeMs.toFixed(1)} ms`;
  $("embed-ms").textContent = `${r.embedMs.toFixed(0)} ms`;
  $("per-sentence-ms").textContent = `${(r.embedMs / n).toFixed(0)} ms`;
  $("n-tokens").textContent = String(r.tokens.reduce((a, b) => a + b, 0));
}

/** Say what the model could not read: text past 256 tokens, sentences of [UNK] only. */
function showNotes(r) {
  const notes = [];
  const all = [{ text: r.query, cut: r.queryCut, unknown: r.queryUnknown }, ...r.ranking];
  const quote = (t) => `“${t.length > 40 ? t.slice(0, 40) + "…" : t}”`;
  for (const c of all) {
    if (c.cut) {
      notes.push(`${quote(c.text)} is longer than the model's ${r.maxTokens} tokens: the last ${c.cut} ` +
                 `word pieces were cut off and play no part in its score.`);
    }
  }
  const unk = all.filter((c) => c.unknown);
  if (unk.length) {
    notes.push(`${unk.map((c) => quote(c.text)).join(", ")} ${unk.length > 1 ? "are" : "is"} all [UNK] ` +
               `to this English model (emoji, scripts it has no word pieces for): such sentences ` +
               `all embed alike and score about 1.000 against each other, which means nothing.`);
  }
  const ul = $("notes");
  ul.replaceChildren(...notes.map((t) => { const li = document.createElement("li"); li.textContent = t; return li; }));
  ul.hidden = !notes.length;
}

async function compare() {
  const query = $("query").value.trim();
  const cands = candidates();
  if (!query) throw inputError("type a sentence to compare against");
  if (!cands.length) throw inputError("give at least one candidate (one per line)");
  if (cands.length + 1 > MAX_SENTENCES) throw inputError(`at most ${MAX_SENTENCES - 1} candidates`);
  running = new AbortController();
  $("compare").disabled = true;
  $("cancel").hidden = false;
  $("busy").hidden = false;
  $("busy").textContent = "working…";
  $("status").textContent = "";
  clearError();
  try {
    const r = await embed([query, ...cands], backends.current, {
      signal: running.signal,
      onProgress: (p) => { $("busy").textContent = `working… ${p.label}`; },
    });
    const q = r.embeddings[0];
    const ranking = cands.map((text, i) => ({ text, score: dot(q, r.embeddings[i + 1]),
                                              cut: r.cut[i + 1], unknown: r.unknown[i + 1] }))
      .sort((a, b) => b.score - a.score);
    const result = { query, ranking, backend: r.backend, device: r.device, ms: r.ms, tokenizeMs: r.tokenizeMs,
                     embedMs: r.embedMs, tokens: r.tokens, queryCut: r.cut[0], queryUnknown: r.unknown[0],
                     maxTokens: r.maxTokens };
    window.emberDemo.lastResult = result;
    showRanking(result);
    $("backend-name").textContent = backends.label(r.backend);
    return result;
  } catch (e) {
    if (e.name === "AbortError") $("status").textContent = "Cancelled.";
    throw e;
  } finally {
    running = null;
    $("compare").disabled = false;
    $("cancel").hidden = true;
    $("busy").hidden = true;
  }
}

function cancel() {
  if (running) running.abort();
}

function setBackend(name) {
  if (!backends) throw inputError("the model is not loaded yet: await emberDemo.ready");
  backends.select(name);
}

function showHint(name) {
  // Pure Python takes seconds per sentence: say so where it runs.
  $("cpu-hint").hidden = !backends || backends.devices[name] !== "python";
}

function resetExamples() {
  $("query").value = EXAMPLES.query;
  $("candidates").value = EXAMPLES.candidates.join("\n");
}

// ---- loading --------------------------------------------------------------------------------

async function main() {
  const t0 = performance.now();
  const MB = 1e6;
  const bar = progressBar(0.6, 0.3);
  resetExamples();
  $("examples").addEventListener("click", resetExamples);
  $("compare").addEventListener("click", () => compare().catch((e) => { if (e.name !== "AbortError") showError(e); }));
  $("cancel").addEventListener("click", cancel);
  $("query").addEventListener("keydown", (e) => { if (e.key === "Enter") $("compare").click(); });
  const weightsUrl = new URL(WEIGHTS, location.href).href;
  const pyFiles = ["tokenizer.py", "model.py", "app.py"];

  // The weights (~45 MB float16), the vocabulary and the Python files download in the worker
  // while Pyodide starts (from the browser's cache after the first visit).
  worker = await loadEmber({
    worker: true, onProgress: bar.boot, prefetch: [weightsUrl, "vocab.txt", ...pyFiles],
    onDownload: (p) => { if (p.url === weightsUrl) bar.weights(p.fraction, p.cached ? "weights (cached)"
      : `weights ${(p.loaded / MB).toFixed(1)} / ${p.total ? (p.total / MB).toFixed(1) : "?"} MB`); },
  });
  const info = { ...worker.info, webgpu: false, webgpuError: null };
  window.emberDemo.info = info;
  window.emberDemo.worker = worker;
  const steps = { emberReady: performance.now() - t0 };

  bar(0.02, "Widening the float16 weights to float32");
  const [devices, widened] = await Promise.all([
    startApp(worker, PY_DIR, pyFiles),
    worker.callJs("weights.js", "widen", [weightsUrl, `${PY_DIR}/weights.f32.safetensors`]),
    worker.fetchFile("vocab.txt", `${PY_DIR}/vocab.txt`),
  ]);
  steps.weightsWidened = performance.now() - t0;
  info.weightsCached = widened.cached;
  bar(0.05, "Loading the model");
  const loaded = await worker.call("app", "load", [`${PY_DIR}/vocab.txt`, `${PY_DIR}/weights.f32.safetensors`, ["cpu"]]);
  info.loadMs = loaded.load_ms;
  info.devices = loaded.devices;
  steps.modelLoaded = performance.now() - t0;

  backends = new Backends({ devices, info, demo: "MiniLM", onChange: showHint });
  bar(0.1, "Ready");
  pageReady();
  info.readyMs = performance.now() - t0;
  info.steps = steps;   // ms since this script started
  $("model-info").textContent =
    `Weights: ${(widened.bytes / MB).toFixed(1)} MB (float16${widened.cached ? ", from the browser's cache" : ""}), ` +
    `${loaded.vocab} WordPiece tokens; ready in ${(info.readyMs / 1000).toFixed(1)} s.`;

  // Now WebGPU, in the background: the page already answers on the CPU meanwhile.
  backends.startWebGPU(worker, () => worker.call("app", "start_webgpu"), t0).then(webgpuDone);
  // And an ember serve process's device, when the site was started with one (build.py demo --remote URL).
  backends.startServer((url, token) => worker.call("app", "start_remote", [url, token])).then(serverDone);
  return info;
}

let webgpuDone, serverDone;
window.emberDemo = window.emberMiniLM = {
  embed,
  compare,
  cancel,
  setBackend,
  lastResult: null,
  info: null,
  worker: null,
  webgpuReady: new Promise((resolve) => { webgpuDone = resolve; }),
  serverReady: new Promise((resolve) => { serverDone = resolve; }),   // {ok, error, info}
};
window.emberDemo.ready = main().catch((e) => {
  webgpuDone({ ok: false, error: `the page did not load: ${e.message || e}`, ms: 0 });
  serverDone({ ok: false, error: `the page did not load: ${e.message || e}`, info: null });
  return loadFailed(e);
});
