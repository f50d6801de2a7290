"""The MNIST page in headless Chromium: ember in a Worker, answers on the CPU first and switches
to WebGPU once it is warm, real test digits on every backend, drawing with the mouse, the
backend switch, no main-thread task over 100 ms, the browser cache on reload. Prints timings
(not asserted)."""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest

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
CPU_LABELS = {"wasm": "CPU (WebAssembly SIMD)", "python": "CPU (pure Python)"}
CPU_DEVICES = set(CPU_LABELS)


def _open(page) -> dict:
    """Open the page, wait for emberDemo.ready (the model answers on the CPU); returns the page's
    info + open->ready ms."""
    t0 = time.perf_counter()
    page.goto(URL)
    info = page.evaluate("""async () => {
        const i = await window.emberDemo.ready;
        return {webgpu: i.webgpu, webgpuError: i.webgpuError, timings: i.timings, readyMs: i.readyMs,
                steps: i.steps, devices: i.devices, weightsCached: i.weightsCached, worker: i.worker};
    }""")
    info["open_to_ready_ms"] = (time.perf_counter() - t0) * 1000
    return info


@pytest.fixture(scope="module")
def _opened(module_page):
    """The page opened once for the tests that take ``mnist_page`` (the first sees it fresh: it
    answers on the CPU first, then switches to WebGPU); the reload, phone and no-WebGPU tests
    open their own."""
    module_page.open_info = _open(module_page)
    return module_page


@pytest.fixture
def mnist_page(_opened, shared_page, request):
    yield from shared_page(request, _opened)


def _webgpu_ready(page) -> dict:
    """Wait for the page's WebGPU start-up (after ready); -> {ok, error, ms} + webgpuReadyMs."""
    r = page.evaluate("() => window.emberDemo.webgpuReady")
    r["webgpuReadyMs"] = page.evaluate("() => window.emberDemo.info.webgpuReadyMs")
    return r


def _predict(page, pixels, backend):
    return page.evaluate("([p, b]) => window.emberDemo.predict(p, b)", [pixels, backend])


def _median_ms(page, pixels, backend, n=N_TIMING):
    return statistics.median(_predict(page, pixels, backend)["ms"] for _ in range(n))


def _pixels(i):
    return [v / 255 for v in IMAGES[i]]


def test_mnist_page_answers_on_the_cpu_first_then_switches_to_webgpu(mnist_page, long_tasks, screenshot):
    """CPU answers as soon as the model is loaded, WebGPU warms up meanwhile and the page
    switches to it and says so; the main thread never runs a task over 100 ms throughout."""
    page, info = mnist_page, mnist_page.open_info
    assert info["worker"] is True
    first = _predict(page, _pixels(0), "cpu")
    # ms since navigation start, as the page's clock counts: open -> first CPU prediction
    first_cpu_ms = page.evaluate("() => performance.now()")
    assert first["digit"] == LABELS[0] and first["backend"] == "cpu"
    assert first["device"] == info["devices"]["cpu"] in CPU_DEVICES
    # The page names the backend in use: WebGPU may already have taken over by now.
    assert page.locator("#backend-name").inner_text() in (CPU_LABELS[first["device"]], "WebGPU")

    gpu = _webgpu_ready(page)
    assert gpu["ok"], f"WebGPU did not start in headless Chromium: {gpu['error']}"
    notice = page.locator("#notice")
    assert notice.is_visible() and notice.get_attribute("data-kind") == "webgpu-ready"
    assert "now running on WebGPU" in notice.inner_text()
    assert page.locator("#backend-name").inner_text() == "WebGPU"
    assert page.locator("#backend-webgpu").is_checked()
    first_gpu = _predict(page, _pixels(0), "webgpu")
    assert first_gpu["digit"] == LABELS[0] and first_gpu["device"] == "webgpu"

    results = {}
    for backend in ("webgpu", "cpu"):
        results[backend] = [_predict(page, _pixels(i), backend) for i in range(N_DIGITS)]
    results["python"] = [_predict(page, _pixels(i), "python") for i in range(3)]
    for backend, rs in results.items():
        got = [r["digit"] for r in rs]
        assert got == LABELS[:len(rs)], f"{backend}: predicted {got}, labels {LABELS[:len(rs)]}"
        assert all(r["backend"] == backend and len(r["probs"]) == 10 for r in rs)
        assert all(abs(sum(r["probs"]) - 1) < 1e-4 for r in rs)
    assert all(r["device"] == "python" for r in results["python"])
    worst = max(abs(a - b) for other in ("cpu", "python") for g, c in zip(results["webgpu"], results[other])
                for a, b in zip(g["probs"], c["probs"]))
    assert worst <= 1e-4, f"WebGPU and CPU probabilities differ by {worst:.2e}"

    # A sample button puts an MNIST digit on the pad; the page shows its prediction.
    page.click('#samples button[data-label="5"]')
    page.evaluate("() => window.emberDemo.idle()")
    assert page.locator("#digit").inner_text() == "5"

    # From the moment the page is parsed and its scripts have run (DOMContentLoaded) on, ember's
    # work (Pyodide, the model, WebGPU's start-up) must never block the main thread: it all runs
    # in the worker. The browser's own parse of the page before that scales with machine load
    # (250 ms once under a load of 6 on 2 cores) and is not ember's to fix.
    ready = page.evaluate("() => performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd")
    tasks = long_tasks(page)
    over = [t for t in tasks if t["duration"] > 100 and t["start"] + t["duration"] > ready]
    assert not over, f"the page's main thread ran tasks over 100 ms after it was parsed ({ready:.0f} ms): {over}"
    print(f"\nmain-thread long tasks (ms): {[(round(t['start']), round(t['duration'])) for t in tasks]}, "
          f"DOMContentLoaded at {ready:.0f} ms")

    # Bad input is a rejected promise with a message, not a wrong answer.
    err = page.evaluate("""() => window.emberDemo.predict([1, 2, 3], "cpu").then(
        () => "resolved", (e) => String(e.message))""")
    assert "784" in err
    err = page.evaluate("""() => window.emberDemo.predict(new Array(784).fill(0), "tpu").then(
        () => "resolved", (e) => String(e.message))""")
    assert "unknown backend" in err

    px = _pixels(1)
    ms = {b: _median_ms(page, px, b) for b in ("webgpu", "cpu", "python")}
    print(f"\nMNIST page (headless Chromium, SwiftShader WebGPU, ember in a Worker): open -> ready on the CPU "
          f"{info['readyMs']:.0f} ms (Pyodide {info['timings']['pyodideReady']:.0f} ms, ember imported "
          f"{info['timings']['emberImported']:.0f} ms, model loaded {info['steps']['modelLoaded']:.0f} ms); "
          f"open -> first CPU ({first['device']}) prediction {first_cpu_ms:.0f} ms; WebGPU ready "
          f"{gpu['webgpuReadyMs']:.0f} ms after open (start-up {gpu['ms']:.0f} ms); per inference (median of "
          f"{N_TIMING}, round trip): WebGPU {ms['webgpu']:.1f} ms, CPU ({first['device']}) {ms['cpu']:.1f} ms, "
          f"pure Python {ms['python']:.1f} ms; max |p_webgpu - p_cpu| {worst:.1e}; "
          f"main-thread long tasks {len(tasks)} (longest {max([t['duration'] for t in tasks], default=0):.0f} ms)")
    screenshot(page, "mnist-page")


def test_mnist_reload_takes_the_wheel_and_weights_from_the_browser_cache(page, request_log, site_dir):
    import json

    manifest = json.loads((site_dir / "manifest.json").read_text())
    wheel = "/" + manifest["wheel"]
    weights = "/demos/mnist/mnist.safetensors"
    request_log.clear()
    first = _open(page)
    assert first["weightsCached"] is False
    seen = [r.split("?")[0] for r in request_log]
    assert wheel in seen and weights in seen, request_log     # the first visit downloads both
    versioned = [r for r in request_log if r.startswith((wheel, weights))]
    assert all("?v=" in r for r in versioned), versioned       # ...under versioned URLs
    page.evaluate("() => window.emberDemo.webgpuReady")

    request_log.clear()
    page.reload()
    again = page.evaluate("async () => { const i = await window.emberDemo.ready; return i.weightsCached; }")
    r = _predict(page, _pixels(3), "cpu")
    assert r["digit"] == LABELS[3]
    seen = [r.split("?")[0] for r in request_log]
    assert again is True
    assert wheel not in seen and weights not in seen, request_log
    assert "/demos/mnist/" in seen          # the page itself is asked for again (revalidated)
    print(f"\nMNIST reload: {len(request_log)} requests ({', '.join(sorted(set(seen)))})")


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


def test_mnist_drawing_and_backend_switch(mnist_page, screenshot):
    page, info = mnist_page, mnist_page.open_info
    gpu = _webgpu_ready(page)
    assert gpu["ok"], f"WebGPU did not start: {gpu['error']}"
    assert page.locator("#backend-name").inner_text() == "WebGPU"

    drawn = list(range(4))     # 7, 2, 1, 0: traced stroke by stroke, ~5 s each here
    got = []
    for i in drawn:
        r = _draw(page, IMAGES[i])
        assert r is not None and r["backend"] == "webgpu"
        assert r["unsure"] is None, r       # a real digit, drawn: named, not "not sure"
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
    assert page.locator("#backend-name").inner_text() == CPU_LABELS[info["devices"]["cpu"]]
    after = page.evaluate("() => window.emberDemo.lastResult")
    assert after["backend"] == "cpu" and after["digit"] == before["digit"]
    assert max(abs(a - b) for a, b in zip(after["probs"], before["probs"])) <= 1e-4
    screenshot(page, "mnist-drawn-cpu")
    if info["devices"]["cpu"] != "python":     # the pure-Python choice, for comparison
        page.click("#backend-python")
        page.evaluate("() => window.emberDemo.idle()")
        assert page.locator("#backend-name").inner_text() == "CPU (pure Python)"
        py = page.evaluate("() => window.emberDemo.lastResult")
        assert py["device"] == "python" and py["digit"] == before["digit"]
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
    r = _predict(page, _pixels(2), "cpu")         # answers before WebGPU's start-up is over
    assert r["digit"] == LABELS[2]
    assert_cpu_fallback(page)
    assert not page.evaluate("() => window.emberDemo.info.webgpu")
    err = page.evaluate("""() => window.emberDemo.predict(new Array(784).fill(0), "webgpu").then(
        () => "resolved", (e) => String(e.message))""")
    assert "WebGPU is not available" in err


def _stroke(page, points):
    box = page.locator("#pad").bounding_box()
    page.mouse.move(box["x"] + points[0][0], box["y"] + points[0][1])
    page.mouse.down()
    for x, y in points[1:]:
        page.mouse.move(box["x"] + x, box["y"] + y, steps=2)
    page.mouse.up()
    page.evaluate("() => window.emberDemo.idle()")
    return page.evaluate("() => window.emberDemo.lastResult")


def test_mnist_says_not_sure_for_a_dot_or_a_scribble(mnist_page, screenshot):
    page = mnist_page
    # A real digit from the pad: named, with its confidence.
    page.click('#samples button[data-label="7"]')
    page.evaluate("() => window.emberDemo.idle()")
    r = page.evaluate("() => window.emberDemo.lastResult")
    assert r["digit"] == 7 and r["unsure"] is None, r
    assert page.locator("#confidence").inner_text().endswith("% sure")
    assert "not sure" not in page.locator("#confidence").inner_text()
    assert not page.locator("#unsure-why").is_visible()

    # A dot: the page does not pretend it is a digit; it names the two likeliest.
    page.click("#clear")
    r = _stroke(page, [(140, 140), (142, 141)])
    assert r["unsure"], r
    text = page.locator("#confidence").inner_text()
    (a, pa), (b, pb) = r["top2"]
    assert text.startswith("not sure:") and f"{a} (" in text and f"or {b} (" in text, text
    assert pa >= pb and page.locator("#unsure-why").is_visible()
    assert "unsure" in page.get_attribute("#digit", "class")
    screenshot(page, "mnist-dot-not-sure")

    # A scribble over the whole pad.
    page.click("#clear")
    zigzag = [(20 + 240 * (i % 2), 20 + 12 * i) for i in range(21)]
    r = _stroke(page, zigzag + [(20 + 12 * i, 260 - 240 * (i % 2)) for i in range(21)])
    assert r["unsure"], r
    assert page.locator("#confidence").inner_text().startswith("not sure:")

    # emberDemo.predict says so too (an all-ink input is nothing like a digit).
    r = _predict(page, [1.0] * 784, "cpu")
    assert r["unsure"] and len(r["top2"]) == 2


def test_mnist_prediction_sits_under_the_pad_on_a_phone(page, screenshot):
    page.set_viewport_size({"width": 390, "height": 844})
    _open(page)
    pad = page.locator("#pad").bounding_box()
    answer = page.locator("#digit").bounding_box()
    gap = answer["y"] - (pad["y"] + pad["height"])
    assert 0 <= gap <= 400, f"the prediction is {gap:.0f} px below the drawing pad at 390 px wide"
    # nothing runs off the side of the screen
    width = page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= 390, width
    screenshot(page, "mnist-phone")
