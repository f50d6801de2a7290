"""A GPU device lost after a page switched to WebGPU (a driver reset, the browser reclaiming the
GPU; here ``GPUDevice.destroy()`` in the page's worker): the worker reports GPUDevice.lost, the
page says so, turns the WebGPU choice off and answers on the CPU (wasm/demo-kit.js
``Backends.lost``, wasm/ember.js ``onWebGPULost``). Issue 12."""
from __future__ import annotations

import pytest

URL = "/demos/mnist/"
DESTROY = "from ember.webgpu.runtime import _RUNTIME\n_RUNTIME[0].driver._dev.destroy()"


@pytest.mark.allow_console_errors   # Chromium logs the destroyed device's lost work
def test_page_falls_back_to_the_cpu_when_the_gpu_device_is_lost(page):
    page.goto(URL)
    page.evaluate("() => window.emberDemo.ready")
    gpu = page.evaluate("() => window.emberDemo.webgpuReady")
    if not gpu["ok"]:
        pytest.skip(f"WebGPU did not start here: {gpu['error']}")
    assert page.locator("#backend-name").inner_text() == "WebGPU"
    page.evaluate("(code) => window.emberDemo.worker.runPython(code)", DESTROY)
    page.wait_for_function("() => document.getElementById('notice').dataset.kind === 'webgpu-lost'",
                           timeout=30_000)
    notice = page.locator("#notice").inner_text()
    assert "WebGPU stopped" in notice and "lost" in notice and "CPU" in notice
    assert page.locator("#backend-webgpu").is_disabled()
    assert page.locator("#backend-name").inner_text() != "WebGPU"
    info = page.evaluate("() => ({webgpu: window.emberDemo.info.webgpu, error: window.emberDemo.info.webgpuError})")
    assert info["webgpu"] is False and "lost" in info["error"]
    r = page.evaluate("() => window.emberDemo.predict(new Array(784).fill(0))")
    assert r["device"] in ("wasm", "python")
    err = page.evaluate("""() => window.emberDemo.predict(new Array(784).fill(0), "webgpu").then(
        () => "resolved", (e) => String(e.message))""")
    assert "not available" in err
