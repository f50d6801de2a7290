"""The OCR page in headless Chromium: ember in a Worker, the three PP-OCRv4 models loaded on the
CPU (WebAssembly SIMD), a sample read through ``emberDemo.read`` gives the same lines as the CLI
(``demos/ocr/ocr.py --json`` natively), the page draws one box per line and highlights a line's
box on click, bad input gives a clear message. Prints the page's per-stage timings."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parent.parent / "demos" / "ocr"
URL = "/demos/ocr/"
SAMPLE = DEMO / "samples" / "receipt.png"

pytestmark = pytest.mark.skipif(not (DEMO / "ch_PP-OCRv4_rec_infer.onnx").is_file(),
                                reason="OCR models missing: run python demos/ocr/prepare.py")


def _start_cli(path: Path):
    """``demos/ocr/ocr.py --json`` on ``path`` natively, started now (it runs while the page
    loads); ``_cli_lines(proc)`` waits for its lines."""
    return subprocess.Popen([sys.executable, str(DEMO / "ocr.py"), str(path), "--json", "--device", "numpy"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _cli_lines(proc) -> list:
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, f"ocr.py failed ({proc.returncode}):\n{err[-4000:]}"
    return json.loads(out)


def _read(page, data: bytes, backend: str):
    return page.evaluate("""async ([bytes, backend]) => {
        const r = await window.emberDemo.read(new Uint8Array(bytes), backend);
        return {lines: JSON.parse(JSON.stringify(r)), timings: r.timings, device: r.device};
    }""", [list(data), backend])


@pytest.fixture(scope="module")
def _opened(module_page):
    """The OCR page opened once for both tests (the CLI reads the sample meanwhile): WebGPU's
    start-up, which compiles the three models' kernels (half a minute on SwiftShader), runs in
    the page's worker while the first test reads on the CPU, as on any fresh page."""
    page = module_page
    page.receipt_cli = _start_cli(SAMPLE)
    page.set_default_timeout(300_000)
    page.goto(URL)
    page.ready_info = page.evaluate("async () => { const i = await window.emberDemo.ready; return {devices: i.devices, readyMs: i.readyMs}; }")
    yield page
    page.receipt_cli.kill()


@pytest.fixture
def ocr_page(_opened, shared_page, request):
    yield from shared_page(request, _opened)


def test_ocr_page_reads_a_sample_like_the_cli(ocr_page):
    page, info, cli = ocr_page, ocr_page.ready_info, ocr_page.receipt_cli
    page.set_default_timeout(300_000)
    assert info["devices"]["cpu"] == "wasm"
    got = _read(page, SAMPLE.read_bytes(), "cpu")
    print(f"\nOCR page, {SAMPLE.name} on {got['device']}: ready in {info['readyMs']:.0f} ms; timings (ms): "
          + ", ".join(f"{k} {v:.0f}" for k, v in got["timings"].items()))
    want = _cli_lines(cli)
    assert [ln["text"] for ln in got["lines"]] == [ln["text"] for ln in want]
    for a, b in zip(got["lines"], want):
        assert abs(a["score"] - b["score"]) < 0.02
        assert all(abs(p - q) <= 3 for pa, pb in zip(a["box"], b["box"]) for p, q in zip(pa, pb)), (a, b)

    # the page itself: one box and one line per result, a click highlights its box
    page.click('#samples button[data-sample="receipt.png"]')
    page.wait_for_function("() => window.emberDemo.lastResult !== null", timeout=300_000)
    n = page.evaluate("() => window.emberDemo.lastResult.lines.length")
    assert n == len(want)
    assert page.locator("#overlay polygon").count() == n
    assert page.locator("#lines li").count() == n
    page.locator("#lines li").nth(2).click()
    assert page.evaluate("() => document.querySelectorAll('#overlay polygon')[2].classList.contains('on')")
    assert page.locator("#timings tbody tr").count() >= 7

    # bad input: a clear message, nothing hangs
    for bad, words in ((b"", "empty"), (b"not an image at all", "not an image"),
                       (SAMPLE.read_bytes()[:200], "not an image")):
        err = page.evaluate("""async (bytes) => {
            try { await window.emberDemo.read(new Uint8Array(bytes), "cpu"); return null; }
            catch (e) { return {name: e.name, message: e.message}; } }""", list(bad))
        assert err is not None and err["name"] == "InputError" and words in err["message"], err


def test_ocr_page_reads_an_image_on_webgpu_like_the_cli(ocr_page, tmp_path):
    """A one-line image through the page's WebGPU backend gives the CLI's lines (numpy). The
    adapter here is Chromium's software one (SwiftShader): the same WGSL a GPU runs, but about a
    thousand times slower, so the image is a small square with one line (the detector still runs
    at 736 x 736, the size PP-OCR scales every image to) rather than the 11-line receipt."""
    sys.path.insert(0, str(DEMO))
    import io

    from make_samples import render

    buf = io.BytesIO()
    render([{"text": "ember 42", "xy": (14, 60), "px": 30}], size=(160, 160)).save(buf, "PNG")
    data = buf.getvalue()
    (tmp_path / "one.png").write_bytes(data)
    page = ocr_page
    page.set_default_timeout(900_000)
    gpu = page.evaluate("() => window.emberDemo.webgpuReady")
    assert gpu["ok"], f"WebGPU did not start in the page: {gpu}"
    cli = _start_cli(tmp_path / "one.png")      # reads natively while the page reads on WebGPU
    try:
        got = _read(page, data, "webgpu")
    except BaseException:
        cli.kill()
        raise
    want = _cli_lines(cli)
    assert [ln["text"].replace(" ", "") for ln in want] == ["ember42"], want
    assert got["device"] == "webgpu"
    print(f"\nOCR page on WebGPU (one line, 160x160): start-up {gpu['ms']:.0f} ms; timings (ms): "
          + ", ".join(f"{k} {v:.0f}" for k, v in got["timings"].items()))
    assert [ln["text"] for ln in got["lines"]] == [ln["text"] for ln in want]
    for a, b in zip(got["lines"], want):
        assert abs(a["score"] - b["score"]) < 0.02
        assert all(abs(p - q) <= 3 for pa, pb in zip(a["box"], b["box"]) for p, q in zip(pa, pb)), (a, b)
