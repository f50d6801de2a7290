// wllama (llama.cpp compiled to WebAssembly) on one GGUF file, timed in the page; driven by
// tests/bench/bench_llm.py, which serves this folder with COOP/COEP (threads need them).
//
// window.benchWllama({url, threads, gpu, prompts: [{name, text}] (or prompt: text), maxTokens,
//                     reps, nCtx, load: {more LoadModelParams}, request: {more completion options},
//                     nativeLog}) -> {
//   status: "ok" | "error", reason, threads, multiThread, crossOriginIsolated, hardwareConcurrency,
//   loadParams, context: {n_ctx, n_batch, n_ubatch, ...}, download_ms, load_ms, file_bytes,
//   runs: [{prompt_name, rep, prompt_n, prompt_ms, prompt_tps, predicted_n, predicted_ms,
//           decode_tps, wall_ms, text, finish_reason}], native: [llama.cpp's log lines]}
// download_ms: fetch of the file from the bench's localhost server into a Blob (HTTP cache
// off); load_ms: Wllama.loadModel from that in-memory Blob (worker + wasm start, GGUF parse,
// llama.cpp's warm-up decode). Every completion is greedy (temperature 0, top_k 1) on the raw
// prompt string (special tokens such as <|im_start|> are parsed), with cache_prompt false, and
// a 1-token completion of an unrelated prompt runs before each timed one, so the timed prompt
// never reuses a cached prefix. With several prompts, each rep runs them in turn (alternating),
// so a change in the machine's load touches every prompt alike.

import { Wllama } from "./node_modules/@wllama/wllama/esm/index.js";

const logEl = document.getElementById("log");
const log = (msg) => {
  logEl.textContent += `\n${performance.now().toFixed(0)} ms  ${msg}`;
};

async function benchWllama(cfg) {
  const out = {
    status: "ok", threads: cfg.threads, gpu: !!cfg.gpu, crossOriginIsolated: self.crossOriginIsolated,
    hardwareConcurrency: navigator.hardwareConcurrency, runs: [], native: [],
  };
  const prompts = cfg.prompts || [{ name: "prompt", text: cfg.prompt }];
  let wllama = null;
  try {
    const wasm = new URL("./node_modules/@wllama/wllama/esm/wasm/wllama.wasm", location.href).href;
    // with nativeLog, llama.cpp's own log (the context's n_batch, flash attention, KV cache
    // types, the CPU features it was built with) is kept in out.native
    const keep = (...args) => { out.native.push(args.map(String).join(" ")); };
    const logger = { debug: keep, log: keep, warn: keep, error: keep };
    wllama = new Wllama({ default: wasm }, { allowOffline: true, suppressNativeLog: !cfg.nativeLog, logger });
    let t = performance.now();
    const resp = await fetch(cfg.url, { cache: "no-store" });
    if (!resp.ok) throw new Error(`GET ${cfg.url}: HTTP ${resp.status}`);
    const blob = await resp.blob();
    out.download_ms = performance.now() - t;
    out.file_bytes = blob.size;
    log(`downloaded ${blob.size} bytes in ${out.download_ms.toFixed(0)} ms`);
    const params = Object.assign({
      n_threads: cfg.threads, n_ctx: cfg.nCtx || 1024, n_gpu_layers: cfg.gpu ? 99999 : 0, n_parallel: 1,
    }, cfg.load || {});
    out.loadParams = params;
    t = performance.now();
    await wllama.loadModel([blob], params);
    out.load_ms = performance.now() - t;
    out.multiThread = wllama.isMultithread();
    out.nbThreads = wllama.getNumThreads();
    const info = wllama.getLoadedContextInfo();
    out.context = { n_ctx: info.n_ctx, n_batch: info.n_batch, n_ubatch: info.n_ubatch };
    log(`loaded in ${out.load_ms.toFixed(0)} ms (multi-thread: ${out.multiThread}, `
        + `threads ${out.nbThreads}, ${JSON.stringify(out.context)})`);
    for (let i = 0; i < (cfg.reps || 1); i++) {
      for (const p of prompts) {
        await wllama.createCompletion({ prompt: "Hello", max_tokens: 1, temperature: 0, top_k: 1 });
        t = performance.now();
        const r = await wllama.createCompletion(Object.assign({
          prompt: p.text, max_tokens: cfg.maxTokens, temperature: 0, top_k: 1, seed: 0, cache_prompt: false,
        }, cfg.request || {}));
        const wall = performance.now() - t;
        const tm = r.timings || {};
        const run = {
          prompt_name: p.name, rep: i, prompt_n: tm.prompt_n, prompt_ms: tm.prompt_ms,
          prompt_tps: tm.prompt_per_second, predicted_n: tm.predicted_n, predicted_ms: tm.predicted_ms,
          decode_tps: tm.predicted_per_second, wall_ms: wall, text: r.choices[0].text,
          finish_reason: r.choices[0].finish_reason, usage: r.usage,
        };
        out.runs.push(run);
        log(`rep ${i} ${p.name}: prompt ${run.prompt_n} tok ${run.prompt_tps?.toFixed(1)} tok/s, `
            + `decode ${run.predicted_n} tok ${run.decode_tps?.toFixed(1)} tok/s`);
      }
    }
  } catch (e) {
    out.status = "error";
    out.reason = `${e && e.name ? e.name : "Error"}: ${e && e.message ? e.message : e}`;
    log(out.reason);
  } finally {
    if (wllama) {
      try { await wllama.exit(); } catch (e) { /* the page is closed next anyway */ }
    }
  }
  return out;
}

window.benchWllama = benchWllama;
window.benchReady = true;
