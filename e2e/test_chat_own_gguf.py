"""The chat page runs a GGUF of the user's (demos/chat: "Open a GGUF file…", drop, and
``emberDemo.loadModel``), in headless Chromium: two tiny models written here with
tests/llm_fixtures.write_tiny_gguf (a llama one with the byte-level BPE vocabulary and ChatML,
one with a SentencePiece vocabulary and a Zephyr template), each opened in the page, its
greedy chat reply equal to ``ember.llm.load(same bytes, device="numpy").chat(...)`` in this
process, its name/architecture/size/types shown; a file that is not a GGUF and one too large
for the page's memory give their error on the page and leave the previous model answering;
``loadModel(null)`` brings SmolLM2 back (its GGUF from the Cache API). One page for them all."""
from __future__ import annotations

import json
import struct
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
URL = "/demos/chat/"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GOLDEN = json.loads((REPO / "tests" / "golden" / "chat_smollm2.json").read_text(encoding="utf-8"))
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there, who are you?"}]
TOKENS = 6
ZEPHYR = ("{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + eos_token + '\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")


@pytest.fixture(scope="module", autouse=True)
def _gguf(site_dir):
    pytest.importorskip("gguf")
    if not (site_dir / "demos" / "chat" / GGUF).is_file():
        pytest.skip("the site has no chat model: demos/chat/prepare.py could not fetch it from PyPI")
    if not json.loads((site_dir / "manifest.json").read_text()).get("extra_wheels"):
        pytest.skip("the site serves no jinja2/markupsafe wheels (demos/chat/prepare.py failed)")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    """{"bpe": bytes, "spm": bytes}: the two tiny GGUFs, and what ember answers with them here."""
    from llm_fixtures import write_tiny_gguf

    d = tmp_path_factory.mktemp("own_gguf")
    spm_md = json.loads((REPO / "tests" / "golden" / "spm_tokenizer.json").read_text(encoding="utf-8"))["metadata"]
    write_tiny_gguf(d / "bpe.gguf", seed=3, qtypes=("Q4_1", "Q8_0"))
    write_tiny_gguf(d / "spm.gguf", seed=1, qtypes=("Q8_0", "Q8_0"),
                    cfg=dict(n_layers=1, dim=32, n_heads=2, n_kv_heads=1, ffn_dim=32, ctx=64),
                    tokenizer={**spm_md, "tokenizer.chat_template": ZEPHYR, "general.name": "Tiny SPM"})
    write_tiny_gguf(d / "phi3.gguf", cfg={"arch": "phi3"})      # an architecture ember does not run
    out = {k: (d / f"{k}.gguf").read_bytes() for k in ("bpe", "spm", "phi3")}
    # a tensor type ggml does not define (99): output_norm.weight's type in the header
    b = bytearray(out["bpe"])
    name = b"output_norm.weight"
    at = b.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    struct.pack_into("<I", b, at + 4 + 8 * struct.unpack_from("<I", b, at)[0], 99)
    out["badtype"] = bytes(b)
    return out


def _native(data: bytes) -> str:
    import ember.llm

    return ember.llm.load(data, device="numpy", context=2048).chat(MESSAGES, max_tokens=TOKENS, temperature=0)


@pytest.fixture(scope="module")
def _opened(module_page):
    module_page.goto(URL)
    module_page.evaluate("async () => { await window.emberDemo.ready; }")
    return module_page


@pytest.fixture
def chat_page(_opened, shared_page, request):
    yield from shared_page(request, _opened)


def _chat(page):
    return page.evaluate("(m) => window.emberDemo.chat(m, {maxTokens: %d, temperature: 0, backend: 'cpu'})" % TOKENS,
                         MESSAGES)


def _load(page, data: bytes, **options):
    """emberDemo.loadModel(Uint8Array) -> its result, or {"error": message} when it rejects."""
    return page.evaluate("""([b, o]) => window.emberDemo.loadModel(new Uint8Array(b), o)
                              .catch((e) => ({error: e.message}))""", [list(data), options])


def test_own_gguf_through_the_file_input_and_load_model(chat_page, models):
    page = chat_page
    # 1. the file input: the byte-level BPE llama model (no general.name: the file's name)
    t0 = time.perf_counter()
    page.set_input_files("#model-file", files=[{"name": "tiny-bpe.gguf", "mimeType": "application/octet-stream",
                                                "buffer": models["bpe"]}])
    page.wait_for_function("() => document.getElementById('model-about').textContent.startsWith('Your file')")
    print(f"\nown GGUF: a {len(models['bpe']) / 1e3:.0f} kB file opened in {time.perf_counter() - t0:.2f} s")
    about = page.inner_text("#model-about")
    assert "tiny-bpe.gguf" in about and "llama" in about and "Q4_1" in about and "Q8_0" in about, about
    assert page.is_visible("#model-builtin") and page.is_enabled("#send")
    user = page.evaluate("() => window.emberDemo.info.userModel")
    assert user["bytes"] == len(models["bpe"]) and user["quantTypes"]["Q4_1"] > 0 and user["architecture"] == "llama"
    r = _chat(page)
    assert r["backend"] == "cpu" and 0 < r["tokens"] <= TOKENS, r
    assert r["text"] == _native(models["bpe"]), r
    # never kept in the Cache API
    keys = page.evaluate("""async () => (await (await caches.open("ember-assets")).keys()).map((r) => r.url)""")
    assert not [k for k in keys if "user" in k or k.startswith("blob:")], keys

    # ... and dropped onto the page
    page.evaluate("""(b) => {
        const dt = new DataTransfer();
        dt.items.add(new File([new Uint8Array(b)], "dropped.gguf"));
        document.body.dispatchEvent(new DragEvent("drop", {dataTransfer: dt, bubbles: true, cancelable: true}));
    }""", list(models["bpe"]))
    page.wait_for_function("() => document.getElementById('model-about').textContent.includes('dropped.gguf')")
    assert _chat(page)["text"] == r["text"]

    # 2. emberDemo.loadModel with the SentencePiece model's bytes
    m = _load(page, models["spm"], backend="cpu")
    assert m == {"name": "Tiny SPM", "architecture": "llama", "parameters": m["parameters"],
                 "bytes": len(models["spm"]), "quantTypes": m["quantTypes"], "backend": "cpu"}, m
    assert m["parameters"] > 0 and set(m["quantTypes"]) == {"Q8_0", "F32"}, m
    assert "Tiny SPM" in page.inner_text("#model-about")
    want = _native(models["spm"])
    r = _chat(page)
    assert r["text"] == want, (r, want)

    # 3. the chat UI itself with the user's model
    page.fill("#prompt", "Hi")
    page.click("#send")
    page.wait_for_function("() => !document.querySelector('#messages li.streaming') && window.emberDemo.lastResult")
    assert page.locator("#messages li.assistant .who").inner_text() == "Tiny SPM"


def test_a_bad_file_says_why_and_the_model_still_answers(chat_page, models):
    page = chat_page
    want = _native(models["spm"])       # (the model the previous test left loaded)
    assert _chat(page)["text"] == want
    junk = bytes(range(256)) * 8
    page.set_input_files("#model-file", files=[{"name": "junk.gguf", "mimeType": "application/octet-stream",
                                                "buffer": junk}])
    page.wait_for_function("() => !document.getElementById('error').hidden")
    shown = page.inner_text("#error")
    assert "junk.gguf cannot be loaded" in shown and "GGUFError" in shown and "GGUF" in shown, shown
    err = _load(page, junk)
    assert "GGUFError" in err["error"] and err["error"] in page.inner_text("#error"), err
    assert _chat(page)["text"] == want
    # an architecture, a tensor type ember does not run: named in the error
    err = _load(page, models["phi3"])
    assert "UnsupportedOp" in err["error"] and "'phi3'" in err["error"], err
    err = _load(page, models["badtype"])
    assert "UnsupportedOp" in err["error"] and "'output_norm.weight'" in err["error"] and "99" in err["error"], err
    assert err["error"] in page.inner_text("#error")
    assert _chat(page)["text"] == want
    # too large for the page's memory (the limit lowered for the test): refused before release
    page.evaluate("() => window.emberDemo.worker.runPython('import app\\napp.MAX_MODEL_BYTES = 1000')")
    try:
        err = _load(page, models["bpe"])
    finally:
        page.evaluate("() => window.emberDemo.worker.runPython('import app\\napp.MAX_MODEL_BYTES = 3 << 30')")
    assert "ResourceError" in err["error"] and "memory" in err["error"], err
    assert "ResourceError" in page.inner_text("#error")
    assert _chat(page)["text"] == want
    # a failure after the old model was released (here: made up, as a browser out of memory
    # would): the previous model (the user's, read again from its Blob) is loaded back
    page.evaluate("""() => window.emberDemo.worker.runPython(
        "import app\\n_load = app.load\\n"
        + "def _boom(*a, **k):\\n    app.load = _load\\n    raise MemoryError('no room for it (a test)')\\n"
        + "app.load = _boom")""")
    err = _load(page, models["bpe"])
    assert "MemoryError" in err["error"] and "no room for it" in err["error"], err
    assert "Tiny SPM" in page.inner_text("#model-about")
    assert _chat(page)["text"] == want
    assert page.is_enabled("#model-file")


def test_back_to_the_built_in_model(chat_page, site_dir):
    page = chat_page
    # the shipped 98 MB GGUF opened as a file of the user's: the load time of a real-size file
    import os

    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    page.set_input_files("#model-file", str(site_dir / "demos" / "chat" / GGUF))
    page.wait_for_function("() => document.getElementById('model-about').textContent.includes('Smollm2')",
                           timeout=120_000)
    print(f"\nown GGUF: the {(site_dir / 'demos' / 'chat' / GGUF).stat().st_size / 1e6:.0f} MB SmolLM2 file "
          f"opened through the input in {time.perf_counter() - t0:.1f} s (load average {load:.2f})")
    assert "Q4_1" in page.inner_text("#model-about")
    u = page.evaluate("() => window.emberDemo.info.userModel")
    print(f"own GGUF: {u['loadMs']:.0f} ms from the pick (ember's load {u['emberLoadMs']:.0f} ms), weights held "
          f"{u['weightsBytes'] / 1e6:.0f} MB, WebAssembly memory {u['heapWarm'] / 1e6:.0f} MB, "
          f"shared {(u['sharedAfter'] or 0) / 1e6:.0f} MB (high-water marks)")
    assert 0.9 * u["bytes"] <= u["weightsBytes"] <= 1.02 * u["bytes"], u
    t0 = time.perf_counter()
    m = page.evaluate("() => window.emberDemo.loadModel(null)")
    print(f"\nown GGUF: back to SmolLM2 (from the Cache API) in {time.perf_counter() - t0:.1f} s")
    assert "SmolLM2" in m["name"] and m["architecture"] == "llama" and m["quantTypes"]["Q4_1"] > 0, m
    assert not page.is_visible("#model-builtin")
    case = GOLDEN["cases"][0]
    r = page.evaluate("(p) => window.emberDemo.generate(p, {maxTokens: 3, temperature: 0, backend: 'cpu'})",
                      case["prompt"])
    assert r["text"].strip() and case["text"].startswith(r["text"]), (r["text"], case["text"])


def test_own_gguf_on_webgpu(chat_page, models):
    page = chat_page
    done = page.evaluate("() => window.emberDemo.webgpuReady")
    if not done["ok"]:
        pytest.skip(f"no WebGPU in this browser: {done['error']}")
    t0 = time.perf_counter()
    m = _load(page, models["bpe"], backend="webgpu")
    assert m.get("backend") == "webgpu", m
    r = page.evaluate("(m) => window.emberDemo.chat(m, {maxTokens: %d, temperature: 0, backend: 'webgpu'})" % TOKENS,
                      MESSAGES)
    print(f"\nown GGUF on WebGPU: loaded and answered in {time.perf_counter() - t0:.1f} s")
    assert r["backend"] == "webgpu" and r["text"] == _native(models["bpe"]), r
    # the CPU picked afterwards: the model goes there from the user's Blob
    r = _chat(page)
    assert r["backend"] == "cpu" and r["text"] == _native(models["bpe"]), r
