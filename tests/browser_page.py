"""One page of Python in headless Chromium, for tests that stand alone (no ember.web site):
a plain ``http.server`` on 127.0.0.1 (random port) serves a temporary folder with the ember
wheel, the npm Pyodide and the files a test adds; the page boots Pyodide, installs the wheel,
runs one Python file with ``runPythonAsync`` and leaves its result (a JSON string) in
``window.result``. Used by tests/test_webgpu_browser.py and tests/test_wasm_browser.py.

    @pytest.fixture(scope="module")
    def page_result(tmp_path_factory):
        return run_page(tmp_path_factory.mktemp("site"), CODE, files={"data.json": "..."})
"""
from __future__ import annotations

import functools
import glob
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYODIDE = os.path.join(ROOT, "wasm", "node_modules", "pyodide")
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-quic"]
WEBGPU_FLAG = "--enable-unsafe-webgpu"   # the one flag that turns WebGPU on (SwiftShader here)

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover
    sync_playwright = None

SKIPS = [
    pytest.mark.skipif(sync_playwright is None, reason="playwright is not installed"),
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no Chromium at {CHROMIUM}"),
    pytest.mark.skipif(not os.path.exists(os.path.join(PYODIDE, "pyodide.asm.wasm")),
                       reason="Pyodide files missing: run `python build.py setup`"),
]

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>ember browser test</title></head>
<body><script type="module">
import { loadPyodide } from "./pyodide/pyodide.mjs";
try {
  const py = await loadPyodide({ indexURL: "./pyodide/" });
  await py.loadPackage("./WHEEL");
  for (const f of FILES) {   // the test's files, into Pyodide's file system under /repo/
    const r = await fetch("./" + f);
    if (!r.ok) throw new Error(`fetch ${f}: ${r.status}`);
    py.FS.mkdirTree("/repo/" + f.split("/").slice(0, -1).join("/"));
    py.FS.writeFile("/repo/" + f, new Uint8Array(await r.arrayBuffer()));
  }
  const code = await (await fetch("./page_code.py")).text();
  window.result = await py.runPythonAsync(code);
} catch (e) {
  window.result = JSON.stringify({ error: String(e && e.stack || e) });
}
</script></body></html>
"""


class _Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".wasm": "application/wasm", ".mjs": "text/javascript", ".js": "text/javascript",
                      ".whl": "application/zip", ".py": "text/plain"}

    def log_message(self, *args):  # keep pytest output clean
        pass


class _IsolatedHandler(_Handler):
    """The same files, cross-origin isolated (COOP/COEP, as ember.web sends): SharedArrayBuffer
    and a wasm thread team exist on such a page."""

    def end_headers(self):
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        super().end_headers()


def wheel_into(d) -> str:
    """The site's wheel when build.py built one (``$EMBER_SITE``), else a fresh build; copied
    into ``d``. Returns its file name."""
    site = os.environ.get("EMBER_SITE")
    found = glob.glob(os.path.join(site, "wheels", "ember-*-py3-none-any.whl")) if site else []
    if found:
        shutil.copy(found[0], d)
    else:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(d), ROOT], check=True, cwd=str(d))
        shutil.rmtree(os.path.join(ROOT, "build"), ignore_errors=True)
    (whl,) = glob.glob(os.path.join(str(d), "ember-*.whl"))
    return os.path.basename(whl)


def _visit(port: int, webgpu: bool, timeout_ms: int, logs: list) -> str:
    """Open the served page in a fresh headless Chromium and return ``window.result``."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=FLAGS + ([WEBGPU_FLAG] if webgpu else []))
        try:
            page = browser.new_page()
            page.on("console", lambda m: logs.append(m.text))
            page.goto(f"http://127.0.0.1:{port}/index.html")
            page.wait_for_function("window.result !== undefined", timeout=timeout_ms)
            return page.evaluate("window.result")
        finally:
            browser.close()


def run_page(d, code: str, *, files=(), links=None, webgpu: bool = False, timeout_ms: int = 600_000,
             isolated: bool = False) -> dict:
    """Serve folder ``d`` (wheel and Pyodide added here; ``links``: {name: path} symlinked in;
    ``files``: paths under ``d`` the page copies into /repo/), run ``code`` in the page and
    return its JSON result as a dict (assertion error with the page's log on failure).
    ``isolated``: serve with COOP/COEP headers (a cross-origin isolated page)."""
    whl = wheel_into(d)
    os.symlink(PYODIDE, os.path.join(str(d), "pyodide"))
    for name, path in (links or {}).items():
        os.symlink(path, os.path.join(str(d), name))
    page = PAGE.replace("WHEEL", whl).replace("FILES", json.dumps(list(files)))
    with open(os.path.join(str(d), "index.html"), "w") as f:
        f.write(page)
    with open(os.path.join(str(d), "page_code.py"), "w") as f:
        f.write(code)
    handler = _IsolatedHandler if isolated else _Handler
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(d)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    logs = []
    try:
        for attempt in (0, 1):
            logs.clear()
            try:
                raw = _visit(server.server_address[1], webgpu, timeout_ms, logs)
                break
            except Exception as e:
                # Chromium's renderer process died under the page ("Target crashed": about one run
                # in ten of test_webgpu_attn_split's page after the file's other tests, never alone
                # in 14 runs; once in bench_web's MNIST page): the page runs once more, and says so
                if attempt or "Target crashed" not in str(e):
                    raise
                import warnings

                warnings.warn(f"browser_page: Chromium's renderer crashed ({e}); running the page once more")
    finally:
        server.shutdown()
        server.server_close()
    res = json.loads(raw)
    assert "error" not in res, res.get("error", "") + "\n" + "\n".join(logs[-20:])
    return res
