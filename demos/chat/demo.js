// The chat page: loading (ember's Worker, the 98 MB GGUF), the conversation UI, and the bridge to
// app.py, which runs ember.llm in the worker (Pyodide never runs on this thread).
//
// JS API (for tests and for pages that embed the demo):
//   await window.emberDemo.ready                 resolves (to .info) once the model answers on
//                                                the CPU; rejects with the load error otherwise
//   window.emberDemo.webgpuReady                 Promise -> {ok, error, fallbackAdapter} once the
//                                                page knows whether this browser's WebGPU works
//                                                (the model goes onto the GPU the first time it
//                                                is used there; fallbackAdapter: a software GPU)
//   await window.emberDemo.generate(prompt, options)   raw text, no chat template
//   await window.emberDemo.chat(messages, options)     messages: [{role, content}], role
//        "system" | "user" | "assistant"; the model's own chat template
//        options: {maxTokens (1..1024, default 256), temperature (0 = greedy, the default),
//                  backend ("cpu" | "webgpu"; default: the one selected on the page),
//                  topK, topP, minP, repetitionPenalty, seed,
//                  onToken(piece, {tokens, promptTokens, prefillMs}) called as text arrives,
//                  signal (an AbortSignal: generation stops after the current token)}
//        -> {text, tokens (new tokens), promptTokens, prefillMs, decodeTokensPerSecond,
//            backend ("cpu" | "webgpu"), device ("wasm" | "python" | "webgpu"), decodeMs,
//            finishReason ("stop": end of turn, "length": maxTokens or the context, "stopped"),
//            threads (the CPU backend's decode: 1, or the wasm thread team's size; null elsewhere)}
//        Errors (a prompt longer than the context, bad options, the model not loaded) show on
//        the page and reject the promise with the same message.
//   await window.emberDemo.send(text)            the Send button with `text` (uses the page's
//                                                system prompt, temperature, max tokens, backend)
//   window.emberDemo.stop()                      the Stop button: the running generation ends
//                                                after the current token (its promise resolves
//                                                with the text so far, finishReason "stopped")
//   window.emberDemo.newChat()                   the "New chat" button
//   window.emberDemo.setBackend(name)            the radio buttons ("cpu" | "webgpu" | "server")
//   window.emberDemo.lastResult, .info, .worker  the last reply's figures, load info, the EmberWorker
//   await window.emberDemo.loadModel(source, {backend})   a GGUF of the user's (a File, Blob,
//        ArrayBuffer or typed array) replaces the model (the "Open a GGUF file…" control does
//        the same) -> {name, architecture, parameters, bytes, quantTypes, backend}; null: back
//        to the built-in SmolLM2. A file that cannot load rejects with its error (shown on the
//        page) and leaves the previous model answering. User files stay out of the Cache API.

import { loadEmber } from "../../wasm/ember.js";
import { $, progressBar, showError, clearError, inputError, loadFailed, pageReady, startApp,
         serially } from "../../wasm/demo-kit.js";

const PY_DIR = "/home/pyodide/chat";
const GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf";
const GGUF_PATH = `${PY_DIR}/model.gguf`;
const USER_PATH = `${PY_DIR}/user.gguf`;
const BUILTIN = "SmolLM2-135M-Instruct";
const USERFILE_JS = new URL("userfile.js", import.meta.url).href;   // runs in the worker
const LABELS = { wasm: "CPU (WebAssembly)", python: "CPU (pure Python)", webgpu: "WebGPU" };
const MB = 1e6;
// JS option name -> app.py's
const OPTIONS = { maxTokens: "max_tokens", temperature: "temperature", backend: "backend", topK: "top_k",
                  topP: "top_p", minP: "min_p", repetitionPenalty: "repetition_penalty", seed: "seed" };

let worker = null;          // the EmberWorker running app.py
let info = null;            // window.emberDemo.info
let loadError = null;       // why the model did not load
let backend = "cpu";        // the page's selected backend
const gpu = { state: "checking", error: null, loading: null };  // checking | available | unavailable | ready | failed
let gpuChecked;             // resolves when gpu.state leaves "checking"
const gpuCheck = new Promise((r) => { gpuChecked = r; });
let running = null;         // the AbortController of the generation in progress
let history = [];           // the conversation so far: [{role, content}]
// The model in use: file null = the built-in GGUF, else the user's Blob (kept as a handle: the
// browser holds its bytes, read again when the model goes onto another backend); cpu: whether
// it is loaded on the CPU backend (a user's file opened on WebGPU is not, until picked)
let current = { file: null, name: BUILTIN, cpu: true };
const ggufUrl = new URL(GGUF, location.href).href;

// The "server" backend: an ember serve process named by the site's remote.json (build.py demo --remote URL).
const server = { state: "none", url: null, token: "", label: "Server GPU", loading: null };  // none | available | ready | failed

const label = (name) => (name === "server" ? server.label
  : name === "cpu" ? LABELS[info?.devices?.cpu] || LABELS.wasm : LABELS.webgpu);

// ---- errors ------------------------------------------------------------------------------------

/** Errors about what was asked (too long a prompt, bad options) as plain messages. */
function readable(e) {
  if (e && ["ContextLengthError", "SamplingError", "ValueError", "TypeError"].includes(e.pythonType)) {
    return Object.assign(inputError(e.pythonMessage), { pythonType: e.pythonType });
  }
  return e;
}

// ---- WebGPU ------------------------------------------------------------------------------------

/** Load the model onto the GPU (once; the GGUF comes from the browser's cache) and warm it up. */
function ensureWebGPU() {
  if (gpu.state === "ready") return Promise.resolve();
  if (gpu.loading) return gpu.loading;
  gpu.loading = (async () => {
    await gpuCheck;
    if (gpu.state !== "available") {
      throw inputError(`WebGPU is not available here (${gpu.error}); use backend "cpu"`);
    }
    $("webgpu-state").textContent = "(loading the model onto the GPU…)";
    $("status").textContent = "Loading the model onto the GPU…";
    const t0 = performance.now();
    await writeCurrent(GGUF_PATH);
    info.webgpuWarm = await worker.call("app", "start_webgpu", [GGUF_PATH, true]);
    info.webgpuReadyMs = performance.now() - t0;
    gpu.state = "ready";
    $("webgpu-state").textContent = info.webgpuWarm.fallback_adapter ? "(a software adapter: slow)" : "";
    $("status").textContent = "";
  })().catch((e) => {
    gpu.loading = null;
    if (gpu.state === "available") {   // the GPU works but the model failed there
      gpu.state = "failed";
      gpu.error = `the model failed on WebGPU: ${e.pythonMessage || e.message || e}`;
      gpuUnavailable();
    }
    $("status").textContent = "";
    throw e;
  });
  return gpu.loading;
}

function gpuUnavailable() {
  const n = $("notice");
  n.hidden = false;
  n.dataset.kind = "no-webgpu";
  n.textContent = `WebGPU is not available here: ${String(gpu.error).replace(/\.$/, "")}. ` +
                  `The chat runs on the ${label("cpu")}.`;
  $("backend-webgpu").disabled = true;
  $("backend-webgpu").parentElement.classList.add("unavailable");
  $("webgpu-state").textContent = "(not available)";
  if (backend === "webgpu") setBackend("cpu");
}

async function checkWebGPU() {
  const r = await worker.initWebGPU().catch((e) => ({ ok: false, error: e.message || String(e) }));
  info.webgpu = r.ok;
  info.webgpuError = r.ok ? null : String(r.error || "navigator.gpu is missing").trim().split("\n").pop();
  gpu.state = r.ok ? "available" : "unavailable";
  gpu.error = info.webgpuError;
  if (r.ok) {
    // A software adapter (SwiftShader and the like) emulates the GPU on the CPU: far slower
    // than the CPU backend for this model; say so before anyone picks it.
    info.webgpuFallback = await worker.runPython(
      "import ember.webgpu\nember.webgpu.info().get('adapter_type') == 'fallback'").catch(() => false);
    worker.onWebGPULost((reason) => {   // a driver reset, the browser reclaiming the GPU...
      gpu.state = "failed";
      gpu.error = String(reason || "the GPU device was lost").trim().split("\n").pop();
      info.webgpu = false;
      info.webgpuError = gpu.error;
      gpuUnavailable();
    });
    $("backend-webgpu").disabled = false;
    $("webgpu-state").textContent = info.webgpuFallback
      ? "(a software adapter here: far slower than the CPU, minutes per reply)"
      : "(the model loads onto the GPU when picked)";
  } else {
    gpuUnavailable();
  }
  gpuChecked();
  return { ok: r.ok, error: info.webgpuError, fallbackAdapter: !!info.webgpuFallback };
}

// ---- the server -----------------------------------------------------------------------------

async function checkServer() {
  const cfg = await fetch(new URL("/remote.json", location.href), { cache: "no-store" })
    .then((r) => (r.ok ? r.json() : null)).catch(() => null);
  if (!cfg || !cfg.url) return { ok: false, error: "no server" };
  Object.assign(server, { state: "available", url: cfg.url, token: cfg.token || "", label: `Server GPU (${cfg.url})` });
  $("server-label").textContent = server.label;
  $("server-state").textContent = "(the model loads onto the server when picked)";
  $("server-choice").hidden = false;
  return { ok: true, error: null };
}

/** Load the model onto the server (once; the GGUF comes from the browser's cache) and warm it up. */
function ensureServer() {
  if (server.state === "ready") return Promise.resolve(info.server);
  if (server.state !== "available") return Promise.reject(inputError('no server backend: start the site with build.py demo --remote URL'));
  if (server.loading) return server.loading;
  server.loading = (async () => {
    $("server-state").textContent = "(loading the model onto the server…)";
    await writeCurrent(GGUF_PATH);
    info.server = await worker.call("app", "start_remote", [server.url, server.token, GGUF_PATH, true]);
    server.state = "ready";
    server.label = `Server GPU (${info.server.server_device} at ${server.url})`;
    $("server-label").textContent = server.label;
    $("server-state").textContent = "";
    if (backend === "server") $("backend-name").textContent = server.label;
    return info.server;
  })().catch((e) => {
    server.loading = null;
    server.state = "failed";
    $("server-state").textContent = `(not available: ${String(e.pythonMessage || e.message || e).trim().split("\n").pop()})`;
    $("server-choice").classList.add("unavailable");
    throw e;
  });
  return server.loading;
}

function setBackend(name) {
  if (name !== "cpu" && name !== "webgpu" && name !== "server") {
    throw inputError(`unknown backend ${JSON.stringify(name)}: use "cpu", "webgpu" or "server"`);
  }
  if (name === "server" && server.state !== "available" && server.state !== "ready") {
    throw inputError('no server backend here: start the site with build.py demo --remote URL');
  }
  if (name === "webgpu" && (gpu.state === "unavailable" || gpu.state === "failed")) {
    throw inputError(`WebGPU is not available here (${gpu.error}); use backend "cpu"`);
  }
  backend = name;
  $(`backend-${name}`).checked = true;
  $("backend-name").textContent = label(name);
  if (name === "server" && worker) {
    serially(() => ensureServer()).catch((e) => {
      showError(readable(e));
      setBackend("cpu");
    });
  }
  if (name === "webgpu" && worker) {
    serially(() => ensureWebGPU()).catch((e) => {
      showError(readable(e));
      setBackend("cpu");
    });
  }
}

// ---- generation ----------------------------------------------------------------------------------

function pyOptions(options, extra) {
  if (options == null) options = {};
  if (typeof options !== "object" || Array.isArray(options)) throw inputError("options must be an object");
  const o = { ...extra };
  for (const [k, v] of Object.entries(options)) {
    if (k === "onToken" || k === "signal") continue;
    if (!(k in OPTIONS)) throw inputError(`unknown option ${JSON.stringify(k)}; use ${Object.keys(OPTIONS).join(", ")}, onToken, signal`);
    if (v !== undefined) o[OPTIONS[k]] = v;
  }
  const n = o.max_tokens;
  if (n !== undefined && !(Number.isInteger(n) && n >= 1 && n <= 1024)) {
    throw inputError(`maxTokens must be a whole number from 1 to 1024, got ${JSON.stringify(n)}`);
  }
  const t = o.temperature;
  if (t !== undefined && !(typeof t === "number" && t >= 0 && t <= 5)) {
    throw inputError(`temperature must be a number from 0 (greedy) to 5, got ${JSON.stringify(t)}`);
  }
  o.backend = o.backend ?? backend;
  if (o.backend !== "cpu" && o.backend !== "webgpu" && o.backend !== "server") {
    throw inputError(`unknown backend ${JSON.stringify(o.backend)}: use "cpu", "webgpu" or "server"`);
  }
  o.yield_each_token = !info.cancelFlags;   // without SharedArrayBuffer a cancel needs the event loop
  return o;
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").hidden = !busy;
  $("stop").disabled = false;
  if (!busy) $("status").textContent = "";
}

function showStats(s, live = false) {
  $("stat-prompt-tokens").textContent = String(s.promptTokens);
  $("stat-prefill").textContent = `${s.prefillMs.toFixed(0)} ms`;
  $("stat-tokens").textContent = String(s.tokens);
  $("stat-speed").textContent = s.tokens > 1 || !live ? `${s.decodeTokensPerSecond.toFixed(1)} tokens/s` : "…";
  $("backend-name").textContent = label(s.backend);
}

/** One generation through app.py (queued: the model runs one call at a time). */
function run(kind, payload, options, { trim = false } = {}) {
  if (!worker) {
    return Promise.reject(inputError(loadError ? `the model did not load: ${loadError}`
                                                : "the model is not loaded yet: await emberDemo.ready"));
  }
  let o;
  try {
    o = pyOptions(options, trim ? { trim: true } : {});
  } catch (e) {
    return Promise.reject(e);
  }
  const onToken = options && typeof options.onToken === "function" ? options.onToken : null;
  const outer = options && options.signal;
  return serially(async () => {
    if (o.backend === "webgpu") await ensureWebGPU();
    if (o.backend === "cpu") await ensureCPU();
    running = new AbortController();
    const stop = () => running && running.abort();
    if (outer) {
      if (outer.aborted) stop();
      else outer.addEventListener("abort", stop, { once: true });
    }
    setBusy(true);
    $("status").textContent = "reading the prompt…";
    try {
      const r = await worker.call("app", kind, [payload, o], {
        signal: running.signal,
        onProgress: (p) => {
          if (p.piece == null) return;
          const s = { tokens: p.tokens, promptTokens: p.prompt_tokens, prefillMs: p.prefill_ms, backend: o.backend,
                      decodeTokensPerSecond: p.decode_s > 0 ? (p.tokens - 1) / p.decode_s : 0 };
          showStats(s, true);
          if (!running.signal.aborted) $("status").textContent = "writing…";
          if (onToken) onToken(p.piece, s);
        },
      });
      const result = { text: r.text, tokens: r.tokens, promptTokens: r.prompt_tokens, prefillMs: r.prefill_ms,
                       decodeTokensPerSecond: r.decode_tokens_per_second, backend: r.backend, device: r.device,
                       decodeMs: r.decode_ms, finishReason: r.finish_reason, dropped: r.dropped, ms: r.ms,
                       threads: r.threads };
      showStats(result);
      window.emberDemo.lastResult = result;
      return result;
    } finally {
      if (outer) outer.removeEventListener("abort", stop);
      running = null;
      setBusy(false);
    }
  });
}

/** The API's calls: errors show on the page and reject with the same message. */
async function api(kind, payload, options) {
  clearError();
  try {
    return await run(kind, payload, options);
  } catch (e) {
    const r = readable(e);
    showError(r);
    throw r;
  }
}

function stop() {
  if (running) {
    running.abort();
    $("stop").disabled = true;
    $("status").textContent = "stopping after this token…";
  }
}

// ---- the conversation ---------------------------------------------------------------------------

function addMessage(role, text) {
  const ol = $("messages");
  const ph = ol.querySelector(".placeholder");
  if (ph) ph.remove();
  const li = document.createElement("li");
  li.className = `message ${role}`;
  li.dataset.role = role;
  const who = document.createElement("span");
  who.className = "who";
  who.textContent = role === "user" ? "You" : current.file ? current.name : "SmolLM2";
  const body = document.createElement("div");
  body.className = "text";
  body.textContent = text;
  li.append(who, body);
  ol.append(li);
  li.scrollIntoView({ block: "end" });
  return li;
}

function note(li, text) {
  const n = document.createElement("div");
  n.className = "note";
  n.textContent = text;
  li.append(n);
}

function controls() {
  const t = Number($("temperature").value);
  const n = Number($("max-tokens").value);
  if (!Number.isInteger(n) || n < 1 || n > 1024) throw inputError("max tokens must be a whole number from 1 to 1024");
  return { temperature: t, maxTokens: n, backend };
}

/** The Send button: the page's conversation + `text`, the reply streamed into a new bubble. */
async function send(text = $("prompt").value) {
  text = String(text).trim();
  if (!text) throw inputError("type a message first");
  if (running) throw inputError("a reply is being written: wait or press Stop");
  clearError();
  const opts = controls();
  const system = $("system").value.trim();
  const user = { role: "user", content: text };
  const messages = [...(system ? [{ role: "system", content: system }] : []), ...history, user];
  const userLi = addMessage("user", text);
  const botLi = addMessage("assistant", "");
  botLi.classList.add("streaming");
  const body = botLi.querySelector(".text");
  $("prompt").value = "";
  try {
    const r = await run("chat", messages, { ...opts, onToken: (piece) => {
      body.textContent += piece;
      botLi.scrollIntoView({ block: "end" });
    } }, { trim: true });
    body.textContent = r.text;    // the same text, whole
    history.push(user, { role: "assistant", content: r.text });
    if (r.finishReason === "stopped") note(botLi, "(stopped)");
    else if (r.finishReason === "length") note(botLi, `(cut at ${r.tokens} tokens: raise “Max tokens” for longer replies)`);
    if (r.dropped) note(botLi, `(the ${r.dropped} oldest message${r.dropped > 1 ? "s were" : " was"} left out: the conversation no longer fits the model's context)`);
    return r;
  } catch (e) {
    userLi.remove();
    botLi.remove();
    if (!$("prompt").value) $("prompt").value = text;
    if (!history.length && !$("messages").children.length) resetMessages();
    throw e;
  } finally {
    botLi.classList.remove("streaming");
  }
}

function resetMessages() {
  const li = document.createElement("li");
  li.className = "placeholder";
  li.textContent = "Ask something, e.g. “What is the capital of France?” or “Write a haiku about the sea.”";
  $("messages").replaceChildren(li);
}

function newChat() {
  stop();
  history = [];
  resetMessages();
  clearError();
  $("prompt").focus();
}

// ---- the model: the built-in one or a GGUF of the user's -----------------------------------------

/** Write the current model's GGUF to `path` in Pyodide's file system: the built-in one from the
 *  browser's cache, a user's file read again from its Blob (in chunks, never cached). */
function writeCurrent(path, onProgress = null) {
  return current.file ? worker.callJs(USERFILE_JS, "writeFile", [current.file, path], { onProgress })
    : worker.fetchFile(ggufUrl, path, { onProgress });
}

/** The CPU backend for a user's model that was opened on WebGPU (once). */
async function ensureCPU() {
  if (current.cpu) return;
  $("status").textContent = "Loading the model onto the CPU…";
  await writeCurrent(GGUF_PATH);
  await worker.call("app", "start_cpu", [GGUF_PATH, true]);
  current.cpu = true;
}

function describe(m) {
  const params = m.parameters >= 1e9 ? `${(m.parameters / 1e9).toFixed(1)} B`
    : `${(m.parameters / 1e6).toFixed(m.parameters < 1e7 ? 2 : 0)} M`;
  const size = m.bytes >= 1e9 ? `${(m.bytes / 1e9).toFixed(2)} GB` : `${(m.bytes / 1e6).toFixed(1)} MB`;
  const types = Object.entries(m.quantTypes).sort((a, b) => b[1] - a[1]).map(([t, n]) => `${t} ×${n}`).join(", ");
  return `${m.name} · ${m.architecture} · ${params} parameters · ${size} · tensors ${types}`;
}

function modelProgress(fraction, label) {
  const bar = $("model-progress");
  bar.hidden = fraction == null;
  if (fraction != null) bar.value = fraction;
  $("status").textContent = label || "";
}

/** The WebGPU and server backends lost their copy of the model (it was released): they load the
 *  current one again when picked. */
function releasedElsewhere() {
  if (gpu.state === "ready") gpu.state = "available";
  gpu.loading = null;
  if (server.state === "ready") server.state = "available";
  server.loading = null;
}

/** Load `source` into the worker and make it the model (see loadModel in the API notes). */
async function switchModel(file, b) {
  if (b === "server") throw inputError('a model of your own runs on "cpu" or "webgpu", not on the server');
  if (b === "webgpu") {
    await gpuCheck;
    if (gpu.state !== "available" && gpu.state !== "ready") {
      throw inputError(`WebGPU is not available here (${gpu.error}); use backend "cpu"`);
    }
  }
  const previous = current;
  const name = file ? (file.name || "model.gguf") : `${GGUF}`;
  const path = file ? USER_PATH : GGUF_PATH;
  const t0 = performance.now();
  $("model-file").disabled = $("model-builtin").disabled = true;
  try {
    current = { file, name, cpu: b === "cpu" };
    modelProgress(0, `Reading ${name}…`);
    await writeCurrent(path, (p) => modelProgress(p.fraction, `Reading ${name}: ${p.label || ""}`));
    modelProgress(null, `Loading ${name} into ember…`);
    const r = await worker.call("app", "load_file", [path, b, name]);
    const m = { name: file ? r.name || name : BUILTIN, architecture: r.architecture, parameters: r.parameters, bytes: r.bytes,
                quantTypes: r.quant_types, backend: b };
    current = { file, name: m.name, cpu: b === "cpu" };
    // what was on the other backends was released with the old model: it goes there when picked
    releasedElsewhere();
    if (b === "webgpu") gpu.state = "ready";
    info.model = m.name;
    // (ms from the pick to ready; ember's load; WebAssembly memory and the thread team's shared
    // memory after it: high-water marks, as info.heapWarm / info.sharedAfter)
    info.userModel = file ? { ...m, loadMs: performance.now() - t0, emberLoadMs: r.load_ms[b], heapWarm: r.heap_warm,
                              sharedAfter: r.shared_after, weightsBytes: r.weights_bytes } : null;
    $("model-about").textContent = `${file ? "Your file" : "Built in"}: ${describe(m)}` +
      (file ? `; loaded in ${((performance.now() - t0) / 1000).toFixed(1)} s.` : ".");
    $("model-builtin").hidden = !file;
    $("model-info").hidden = !!file;   // (the built-in model's file and load figures)
    setBackend(b);
    newChat();
    return m;
  } catch (e) {
    current = previous;
    // A file refused by its header (not GGUF, an unsupported architecture, tensor type or
    // vocabulary, too large) left the model loaded; one that failed later had it released:
    // load the previous one again.
    const still = await worker.call("app", "loaded").catch(() => []);
    let again = "";
    if (!still.length) {
      modelProgress(null, "Loading the previous model again…");
      try {
        await writeCurrent(previous.file ? USER_PATH : GGUF_PATH);
        await worker.call("app", "load_file", [previous.file ? USER_PATH : GGUF_PATH, "cpu", previous.name]);
        current = { ...previous, cpu: true };
      } catch (e2) {
        again = ` (and the previous model did not load again: ${e2.pythonMessage || e2.message || e2}; reload the page)`;
      }
      releasedElsewhere();
      if (backend !== "cpu") setBackend("cpu");
    }
    if (e && e.pythonType) {
      throw Object.assign(inputError(`${name} cannot be loaded: ${e.pythonType}: ${e.pythonMessage}${again}`),
                          { errorType: e.pythonType });
    }
    if (again && e && typeof e.message === "string") e.message += again;
    throw e;
  } finally {
    modelProgress(null, "");
    $("model-file").disabled = $("model-builtin").disabled = false;
  }
}

/** window.emberDemo.loadModel: a File, Blob, ArrayBuffer or typed array; null: the built-in model. */
async function loadModel(source, options = {}) {
  clearError();
  try {
    if (!worker) throw inputError(loadError ? `the page did not load: ${loadError}` : "await emberDemo.ready first");
    let file = source;
    if (source instanceof ArrayBuffer || ArrayBuffer.isView(source)) file = new Blob([source]);
    else if (source != null && !(source instanceof Blob)) {
      throw inputError("loadModel: give a File, Blob, ArrayBuffer or typed array (null: the built-in model)");
    }
    if (file && file.size === 0) throw inputError("loadModel: the file is empty");
    const b = (options && options.backend) || backend;
    if (b !== "cpu" && b !== "webgpu" && b !== "server") {
      throw inputError(`unknown backend ${JSON.stringify(b)}: use "cpu" or "webgpu"`);
    }
    stop();
    return await serially(() => switchModel(file, b));
  } catch (e) {
    const r = readable(e);
    showError(r);
    throw r;
  }
}

// ---- loading -------------------------------------------------------------------------------------

async function main() {
  const t0 = performance.now();
  const bar = progressBar(0.35, 0.5);
  const steps = {};
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    send().catch((err) => showError(readable(err)));
  });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      if (!$("send").disabled) $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", stop);
  $("new-chat").addEventListener("click", newChat);
  $("temperature").addEventListener("input", () => {
    $("temperature-value").textContent = Number($("temperature").value).toFixed(2);
  });
  for (const r of document.querySelectorAll('input[name="backend"]')) {
    r.addEventListener("change", () => {
      if (!r.checked) return;
      try {
        setBackend(r.value);
      } catch (e) {
        showError(e);
        setBackend("cpu");
      }
    });
  }

  // The GGUF (98 MB; the Cache API's copy after the first visit) downloads in the worker while
  // Pyodide starts.
  let cachedModel = false;
  const download = { reports: 0, label: "" };   // info.download: what the bar said about the GGUF
  worker = await loadEmber({
    worker: true, onProgress: bar.boot, prefetch: [ggufUrl, "app.py"],
    onDownload: (p) => {
      if (p.url !== ggufUrl) return;
      cachedModel = p.cached;
      download.reports += 1;
      download.label = p.cached ? "model (from the browser's cache)"
        : `model ${(p.loaded / MB).toFixed(1)} / ${p.total ? (p.total / MB).toFixed(1) : "?"} MB` +
          (p.total ? ` (${(100 * p.loaded / p.total).toFixed(0)}%)` : "");
      bar.weights(p.fraction, download.label);
    },
  });
  info = { ...worker.info, webgpu: false, webgpuError: null, download };
  window.emberDemo.info = info;
  window.emberDemo.worker = worker;
  steps.emberReady = performance.now() - t0;

  const [devices, got] = await Promise.all([
    startApp(worker, PY_DIR, ["app.py"]),
    worker.fetchFile(ggufUrl, GGUF_PATH),
  ]);
  info.devices = devices;
  info.modelCached = got.cached || cachedModel;
  info.modelBytes = got.bytes;
  steps.modelDownloaded = performance.now() - t0;
  $("cpu-label").textContent = label("cpu");
  bar(0.1, `Loading the model (${(got.bytes / MB).toFixed(0)} MB) into ember`);
  const loaded = await worker.call("app", "load", [GGUF_PATH, ["cpu"], true]);
  info.loadMs = loaded.load_ms.cpu;
  info.warm = loaded.warm;   // {ms, steps}: the CPU decode step warmed up in the load (app.py)
  // WebAssembly memory (its high-water mark) before and after the load, and what the model holds
  info.heapBefore = loaded.heap_before;
  info.heapAfter = loaded.heap_after;
  info.weightsBytes = loaded.weights_bytes;
  // ... after the warm-up (the key/value cache made), and the thread team's shared memory
  info.heapWarm = loaded.heap_warm;
  info.sharedBefore = loaded.shared_before;
  info.sharedAfter = loaded.shared_after;
  info.context = loaded.context;
  info.model = loaded.name;
  steps.modelLoaded = performance.now() - t0;
  bar(0.15, "Ready");
  setBackend("cpu");
  pageReady();
  info.readyMs = performance.now() - t0;
  info.steps = steps;   // ms since this script started
  $("model-info").textContent =
    `Model file ${(got.bytes / MB).toFixed(1)} MB${info.modelCached ? " (from the browser's cache)" : ""}, ` +
    `context ${loaded.context} tokens, ${loaded.vocab.toLocaleString("en")} token vocabulary; ` +
    `loaded in ${(info.loadMs / 1000).toFixed(1)} s, page ready in ${(info.readyMs / 1000).toFixed(1)} s.`;
  $("model-about").textContent = `Built in: ${BUILTIN} · llama · 135 M parameters · ${(got.bytes / MB).toFixed(1)} MB · Q4_1.`;
  $("model-file").addEventListener("change", () => {
    const f = $("model-file").files[0];
    $("model-file").value = "";
    if (f) loadModel(f).catch(() => {});   // (shown on the page)
  });
  $("model-builtin").addEventListener("click", () => loadModel(null).catch(() => {}));
  document.addEventListener("dragover", (e) => {
    if (e.dataTransfer && [...e.dataTransfer.types].includes("Files")) e.preventDefault();
  });
  document.addEventListener("drop", (e) => {
    const f = e.dataTransfer && e.dataTransfer.files[0];
    if (!f) return;
    e.preventDefault();
    if (!/\.gguf$/i.test(f.name)) {
      showError(inputError(`${f.name} is not a .gguf file: drop a GGUF model here`));
      return;
    }
    loadModel(f).catch(() => {});
  });
  $("prompt").focus();

  checkWebGPU().then(webgpuDone);
  checkServer().then(serverChecked);
  return info;
}

let webgpuDone, serverChecked;
window.emberDemo = {
  generate: (prompt, options) => api("generate", prompt, options),
  chat: (messages, options) => api("chat", messages, options),
  send: (text) => send(text).catch((e) => { const r = readable(e); showError(r); throw r; }),
  stop,
  newChat,
  setBackend,
  lastResult: null,
  info: null,
  worker: null,
  webgpuReady: new Promise((resolve) => { webgpuDone = resolve; }),
  serverChecked: new Promise((resolve) => { serverChecked = resolve; }),   // {ok, error}: a server is named
  startServer: () => serially(() => ensureServer()),   // the model onto the server -> {server_device, ...}
  loadModel,   // (source, {backend}) -> {name, architecture, parameters, bytes, quantTypes, backend}
};
window.emberDemo.ready = main().catch((e) => {
  loadError = e.pythonMessage || e.message || String(e);
  worker = null;
  gpuChecked();
  webgpuDone({ ok: false, error: `the page did not load: ${loadError}` });
  serverChecked({ ok: false, error: `the page did not load: ${loadError}` });
  return loadFailed(readable(e));
});
