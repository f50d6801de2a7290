"""The MNIST page in headless Chromium: load, predict real test digits on WebGPU and on the CPU,
draw digits with the mouse, switch backends in the UI. Prints timings (not asserted)."""
from __future__ import annotations

import statistics
import time
from pathlib import Path

DEMO = Path(__file__).resolve().parent.parent / "demos" / "mnist"
URL = "/demos/mnist/"
N_DIGITS = 12       # real test digits predicted through emberDemo.predict on each backend
N_TIMING = 7        # repeated predictions for the per-inference medians


def _digits():
    import json

    doc = json.loads((DEMO / "testdigits.json").read_text())
    images = [list(bytes.fromhex(h)) for h in doc["images_hex"]]
    return images, doc["labels"]


IMAGES, LABELS = _digits()


def _open(page) -> dict:
    """Open the page, wait for emberDemo.ready; returns the page's info + open->ready ms."""
    t0 = time.perf_counter()
    page.goto(URL)
    info = page.evaluate("""async () => {
        const i = await window.emberDemo.ready;
        return {webgpu: i.webgpu, webgpuError: i.webgpuError, timings: i.timings, readyMs: i.readyMs,
                steps: i.steps};
    }""")
    info["open_to_ready_ms"] = (time.perf_counter() - t0) * 1000
    return info


def _predict(page, pixels, backend):
    return page.evaluate("([p, b]) => window.emberDemo.predict(p, b)", [pixels, backend])


def _median_ms(page, pixels, backend, n=N_TIMING):
    return statistics.median(_predict(page, pixels, backend)["ms"] for _ in range(n))


def test_mnist_page_predicts_on_webgpu_and_cpu(page, screenshot):
    t0 = time.perf_counter()
    info = _open(page)
    assert info["webgpu"], f"WebGPU did not start in headless Chromium: {info['webgpuError']}"
    first = _predict(page, [v / 255 for v in IMAGES[0]], "webgpu")
    first_ms = (time.perf_counter() - t0) * 1000
    assert first["digit"] == LABELS[0]
    assert page.locator("#notice").is_hidden()     # no CPU fallback notice with WebGPU on

    results = {}
    for backend in ("webgpu", "cpu"):
        results[backend] = [_predict(page, [v / 255 for v in img], backend) for img in IMAGES[:N_DIGITS]]
    for backend, rs in results.items():
        got = [r["digit"] for r in rs]
        assert got == LABELS[:N_DIGITS], f"{backend}: predicted {got}, labels {LABELS[:N_DIGITS]}"
        assert all(r["backend"] == backend and len(r["probs"]) == 10 for r in rs)
        assert all(abs(sum(r["probs"]) - 1) < 1e-4 for r in rs)
    worst = max(abs(a - b) for g, c in zip(results["webgpu"], results["cpu"])
                for a, b in zip(g["probs"], c["probs"]))
    assert worst <= 1e-4, f"WebGPU and CPU probabilities differ by {worst:.2e}"

    # Bad input is a rejected promise with a message, not a wrong answer.
    err = page.evaluate("""() => window.emberDemo.predict([1, 2, 3], "cpu").then(
        () => "resolved", (e) => String(e.message))""")
    assert "784" in err

    px = [v / 255 for v in IMAGES[1]]
    ms = {b: _median_ms(page, px, b) for b in ("webgpu", "cpu")}
    print(f"\nMNIST page (headless Chromium, SwiftShader WebGPU): open -> ready "
          f"{info['open_to_ready_ms']:.0f} ms (Pyodide {info['timings']['pyodideReady']:.0f} ms, "
          f"ember imported {info['timings']['emberImported']:.0f} ms, model loaded "
          f"{info['steps']['modelLoaded']:.0f} ms, WebGPU kernels warm {info['steps']['webgpuWarm']:.0f} ms); "
          f"open -> first prediction "
          f"{first_ms:.0f} ms; per inference (median of {N_TIMING}): WebGPU {ms['webgpu']:.1f} ms, "
          f"CPU (pure Python) {ms['cpu']:.1f} ms; max |p_webgpu - p_cpu| {worst:.1e}")
    # A sample button puts an MNIST digit on the pad; the page shows its prediction.
    page.click('#samples button[data-label="5"]')
    page.evaluate("() => window.emberDemo.idle()")
    assert page.locator("#digit").inner_text() == "5"
    screenshot(page, "mnist-page")


def _strokes(img, cell):
    """Horizontal strokes along the runs of bright pixels of a 28x28 digit, in pad pixels."""
    out = []
    for y in range(28):
        x = 0
        while x < 28:
            if img[y * 28 + x] >= 128:
                start = x
                while x + 1 < 28 and img[y * 28 + x + 1] >= 128:
                    x += 1
                out.append(((start + 0.5) * cell, (y + 0.5) * cell, (x + 0.5) * cell))
            x += 1
    return out


def _draw(page, img):
    box = page.locator("#pad").bounding_box()
    cell = box["width"] / 28
    page.click("#clear")
    for x0, y, x1 in _strokes(img, cell):
        page.mouse.move(box["x"] + x0, box["y"] + y)
        page.mouse.down()
        page.mouse.move(box["x"] + x1, box["y"] + y, steps=2)
        page.mouse.up()
    page.evaluate("() => window.emberDemo.idle()")
    return page.evaluate("() => window.emberDemo.lastResult")


def test_mnist_drawing_and_backend_switch(page, screenshot):
    info = _open(page)
    assert info["webgpu"], f"WebGPU did not start: {info['webgpuError']}"
    assert page.locator("#backend-name").inner_text() == "WebGPU"

    drawn = list(range(4))     # 7, 2, 1, 0: traced stroke by stroke, ~5 s each here
    got = []
    for i in drawn:
        r = _draw(page, IMAGES[i])
        assert r is not None and r["backend"] == "webgpu"
        got.append(r["digit"])
    # The page shows what it predicted.
    assert page.locator("#digit").inner_text() == str(got[-1])
    print(f"\ndrawn digits {[LABELS[i] for i in drawn]} -> predicted {got}")
    assert got == [LABELS[i] for i in drawn]
    # The preprocessed 28x28 input is a centred digit: its ink's centre of mass is near (14, 14).
    com = page.evaluate("""() => {
        const p = window.emberDemo.preprocess(document.getElementById("pad"));
        let m = 0, x = 0, y = 0;
        p.forEach((v, i) => { m += v; x += v * (i % 28); y += v * Math.floor(i / 28); });
        return [x / m, y / m];
    }""")
    assert abs(com[0] - 14) <= 0.5 and abs(com[1] - 14) <= 0.5, com

    # Switch to the CPU in the UI: the page says so and predicts there, with the same answer.
    before = page.evaluate("() => window.emberDemo.lastResult")
    page.click("#backend-cpu")
    page.evaluate("() => window.emberDemo.idle()")
    assert page.locator("#backend-name").inner_text() == "CPU (pure Python)"
    after = page.evaluate("() => window.emberDemo.lastResult")
    assert after["backend"] == "cpu" and after["digit"] == before["digit"]
    assert max(abs(a - b) for a, b in zip(after["probs"], before["probs"])) <= 1e-4
    screenshot(page, "mnist-drawn-cpu")
    page.click("#backend-webgpu")
    page.evaluate("() => window.emberDemo.idle()")
    assert page.locator("#backend-name").inner_text() == "WebGPU"
    assert page.evaluate("() => window.emberDemo.lastResult.backend") == "webgpu"

    page.click("#clear")
    assert page.locator("#digit").inner_text() == "?"


def test_mnist_page_without_webgpu_falls_back_to_cpu(page_without_webgpu, assert_cpu_fallback):
    # A page where navigator.gpu does not exist: the demo must say so and run on the CPU.
    # (Console errors fail the test, as with every page fixture.)
    page = page_without_webgpu
    info = _open(page)
    assert not info["webgpu"]
    assert_cpu_fallback(page)
    r = _predict(page, [v / 255 for v in IMAGES[2]], "cpu")
    assert r["digit"] == LABELS[2]
    err = page.evaluate("""() => window.emberDemo.predict(new Array(784).fill(0), "webgpu").then(
        () => "resolved", (e) => String(e.message))""")
    assert "WebGPU is not available" in err
