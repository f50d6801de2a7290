"""The served site in headless Chromium: the index, the headers, ember booting offline in the
page and running ops on the CPU and on WebGPU, the embedding example."""
from __future__ import annotations

import hashlib
import json
import urllib.request

import pytest


def _get(url: str, headers=None):
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status, r.headers, r.read()   # r.headers: case-insensitive


def test_index_lists_the_demos(page, server, site_dir, screenshot):
    manifest = json.loads((site_dir / "manifest.json").read_text())
    resp = page.goto("/")
    assert resp.status == 200
    assert page.title() == "ember demos"
    links = page.eval_on_selector_all("#demos a", "els => els.map(e => e.getAttribute('href'))")
    assert links == [d["url"] for d in manifest["demos"]]
    assert "demos/embed/" in links
    # the demos come first, the how-to example after them
    assert {"demos/chat/", "demos/classify/", "demos/minilm/", "demos/mnist/"} <= set(links[:-1]), links
    assert links[-1] == "demos/embed/", links
    screenshot(page, "index")


def test_headers_over_http(server, site_dir):
    manifest = json.loads((site_dir / "manifest.json").read_text())
    for path, mime in [("", "text/html"), ("pyodide/pyodide.asm.wasm", "application/wasm"),
                       ("pyodide/pyodide.mjs", "text/javascript"), ("wasm/ember.js", "text/javascript"),
                       ("manifest.json", "application/json"), (manifest["wheel"], "application/zip")]:
        status, headers, _ = _get(server + path, {"Accept-Encoding": "identity"})
        assert status == 200, path
        assert headers["Content-Type"].split(";")[0] == mime, path
        assert headers["Cross-Origin-Opener-Policy"] == "same-origin"
        assert headers["Cross-Origin-Embedder-Policy"] == "require-corp"


def test_page_is_cross_origin_isolated(page):
    page.goto("/")
    assert page.evaluate("crossOriginIsolated") is True


@pytest.fixture(scope="module")
def _booted(module_page, load_ember):
    """The index with ember booted on the CPU (one boot for the tests below that use it)."""
    page = module_page
    # Every request must stay on the site: the loader must never reach for a CDN.
    page.outside = []
    # (blob: URLs of the site's own origin are in-memory: the wasm thread team's worker script)
    page.on("request", lambda r: None if r.url.startswith(("http://127.0.0.1", "data:", "blob:http://127.0.0.1"))
            else page.outside.append(r.url))
    page.ember_info = load_ember(page, "/")
    return page


@pytest.fixture
def cpu_page(_booted, shared_page, request):
    yield from shared_page(request, _booted)


def test_ember_boots_offline_reports_progress_and_runs_on_cpu(cpu_page, run_python):
    page, info, outside = cpu_page, cpu_page.ember_info, cpu_page.outside
    assert info["version"] == run_python(page, "import ember; ember.__version__")
    assert outside == []
    labels = [label for label, _ in info["progress"]]
    for want in ("Loading Python runtime", "Downloading ember", "Installing ember", "Ready"):
        assert want in labels, labels
    fractions = [f for _, f in info["progress"]]
    assert fractions == sorted(fractions) and fractions[0] == 0 and fractions[-1] == 1
    print(f"\npage open -> Pyodide ready {info['openToReady'] / 1000:.2f} s, "
          f"-> ember imported {info['openToImported'] / 1000:.2f} s")
    got = run_python(page, """
import sys, ember
x = ember.tensor([[1.0, -2.0, 3.0], [4.0, 5.0, -6.0]])
y = (x * x).sum(axis=1)
[sys.version_info[:2] == (3, 14), y.device, y.shape == (2,), y.tolist()]
""")
    np = pytest.importorskip("numpy")
    x = np.array([[1.0, -2.0, 3.0], [4.0, 5.0, -6.0]], np.float32)
    assert got[:3] == [True, "python", True]
    np.testing.assert_allclose(got[3], (x * x).sum(axis=1), rtol=1e-6)


def test_fetch_bytes_from_python_and_js(cpu_page, run_python, site_dir):
    # A gzip-encoded file (JSON > 1 KiB): progress must count decoded bytes against the real size.
    page = cpu_page
    body = (site_dir / "pyodide" / "pyodide-lock.json").read_bytes()
    got = run_python(page, """
import hashlib, ember.wasm
seen = []
data = await ember.wasm.fetch_bytes("/pyodide/pyodide-lock.json", lambda n, total: seen.append([n, total]))
[ember.wasm.is_pyodide(), len(data), hashlib.sha256(data).hexdigest(), seen[0], seen[-1]]
""")
    assert got == [True, len(body), hashlib.sha256(body).hexdigest(), [0, len(body)], [len(body), len(body)]]
    js = page.evaluate("""async () => {
        const { fetchBytes } = await import("/wasm/ember.js");
        const seen = [];
        const b = await fetchBytes("/pyodide/pyodide-lock.json", { onProgress: (p) => seen.push([p.loaded, p.total, p.fraction]) });
        return [b.length, seen[seen.length - 1], seen.every(([n, t, f]) => t === b.length && f <= 1)];
    }""")
    assert js == [len(body), [len(body), len(body), 1], True]


@pytest.mark.allow_console_errors  # the browser logs the 404 of the missing file itself
def test_fetch_bytes_names_the_url_on_failure(cpu_page, run_python):
    page = cpu_page
    msg = run_python(page, """
import ember.wasm
try:
    await ember.wasm.fetch_bytes("/no/such/weights.safetensors")
    r = "no error"
except OSError as e:
    r = str(e)
r
""")
    assert "/no/such/weights.safetensors" in msg and "404" in msg


def test_ember_runs_on_webgpu_in_the_page(webgpu_ember_page, run_python):
    page, info = webgpu_ember_page, webgpu_ember_page.ember_info
    assert info["webgpu"] is True, info["webgpuError"]
    print(f"\npage open -> WebGPU ready {info['timings']['webgpuReady'] / 1000:.2f} s")
    got = run_python(page, """
import ember
a = ember.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], device="webgpu")
b = ember.tensor([[1.0, 0.5], [-1.0, 2.0], [0.25, 1.0]], device="webgpu")
y = ember.matmul(a, b) * 2.0 + 1.0
z = await (a * a).sum(axis=0).data_async()     # async readback (mapAsync awaited)
[y.device, y.tolist(), z]                       # tolist(): sync readback through JSPI
""")
    np = pytest.importorskip("numpy")
    a = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
    b = np.array([[1.0, 0.5], [-1.0, 2.0], [0.25, 1.0]], np.float32)
    assert got[0] == "webgpu"
    np.testing.assert_allclose(got[1], (a @ b) * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(got[2], (a * a).sum(axis=0), rtol=1e-6)


def test_embed_example(page, screenshot):
    page.goto("/demos/embed/")
    page.wait_for_function("window.embedResult !== undefined")
    screenshot(page, "embed")
    text = page.evaluate("window.embedResult")
    np = pytest.importorskip("numpy")
    x = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    assert f"x @ x + 1 = {(x @ x + 1).tolist()}" in text, text
    assert "device=webgpu" in text, text
    # the page shows its own source, and links back to the index
    page.wait_for_function("!document.getElementById('source').textContent.startsWith('loading')")
    src = page.text_content("#source")
    assert "loadPyodide" in src and "runPythonAsync" in src and "<!doctype html>" in src.lower(), src[:200]
    assert page.is_visible("#source")
    page.click("#back")
    page.wait_for_url("**/")
    assert page.title() == "ember demos"
