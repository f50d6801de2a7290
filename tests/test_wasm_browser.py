"""The whole op-case list on device "wasm" in headless Chromium: Pyodide on the page's main
thread, the SIMD module compiled asynchronously by ``await ember.wasm.init()`` (what a page
should do; Chromium 156 also allows this small module to compile synchronously there) and
instantiated on Pyodide's memory. Expected values
come from numpy on the host, as in tests/test_pyodide.py. Stands alone like
tests/test_webgpu_browser.py: a plain ``http.server`` on 127.0.0.1 serves the wheel, the npm
Pyodide, the case files and one page."""
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

np = pytest.importorskip("numpy")

import op_cases  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYODIDE = os.path.join(ROOT, "wasm", "node_modules", "pyodide")
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-quic"]

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover
    sync_playwright = None

pytestmark = [
    pytest.mark.skipif(sync_playwright is None, reason="playwright is not installed"),
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no Chromium at {CHROMIUM}"),
    pytest.mark.skipif(not os.path.exists(os.path.join(PYODIDE, "pyodide.asm.wasm")),
                       reason="Pyodide files missing: run `python build.py setup`"),
]

PAGE_CODE = r'''
import json, sys, traceback
import ember
sys.path.insert(0, "/repo/tests")
import op_cases

out = {}
out["init"] = await ember.wasm.init()
out["devices"] = ember.devices()
want = json.load(open("/repo/expected.json"))
res = out["results"] = {}
for case in op_cases.all_cases():
    if "wasm" in case.skip:
        res[case.id] = ["skip", case.skip["wasm"]]
        continue
    try:
        got = op_cases.run_case(ember, case, "wasm")
        ok, msg = op_cases.check_results(case, got, want[case.id])
    except Exception:
        ok, msg = False, traceback.format_exc(limit=4)
    res[case.id] = ["pass" if ok else "fail", msg]
json.dumps(out)
'''

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>ember wasm op cases</title></head>
<body><script type="module">
import { loadPyodide } from "./pyodide/pyodide.mjs";
try {
  const py = await loadPyodide({ indexURL: "./pyodide/" });
  await py.loadPackage("./WHEEL");
  py.FS.mkdirTree("/repo/tests/golden");
  for (const f of ["tests/op_cases.py", "tests/op_cases_nn.py", "tests/golden/nn_ops.safetensors",
                   "expected.json"]) {
    const r = await fetch("./" + f);
    if (!r.ok) throw new Error(`fetch ${f}: ${r.status}`);
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

    def log_message(self, *args):
        pass


def _wheel(d) -> str:
    site = os.environ.get("EMBER_SITE")
    found = glob.glob(os.path.join(site, "wheels", "ember-*-py3-none-any.whl")) if site else []
    if found:
        shutil.copy(found[0], d)
    else:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(d), ROOT], check=True, cwd=str(d))
        shutil.rmtree(os.path.join(ROOT, "build"), ignore_errors=True)
    (whl,) = glob.glob(str(d / "ember-*.whl"))
    return os.path.basename(whl)


@pytest.fixture(scope="module")
def page_result(tmp_path_factory):
    d = tmp_path_factory.mktemp("ember-wasm-site")
    whl = _wheel(d)
    os.symlink(PYODIDE, d / "pyodide")
    os.symlink(os.path.join(ROOT, "tests"), d / "tests")
    want = {c.id: op_cases.expected(np, c) for c in op_cases.all_cases()}
    (d / "expected.json").write_text(json.dumps(want))
    (d / "index.html").write_text(PAGE.replace("WHEEL", whl))
    (d / "page_code.py").write_text(PAGE_CODE)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, directory=str(d)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
            try:
                page = browser.new_page()
                logs = []
                page.on("console", lambda m: logs.append(m.text))
                page.goto(f"http://127.0.0.1:{server.server_address[1]}/index.html")
                page.wait_for_function("window.result !== undefined", timeout=600_000)
                raw = page.evaluate("window.result")
            finally:
                browser.close()
    finally:
        server.shutdown()
        server.server_close()
    res = json.loads(raw)
    assert "error" not in res, res.get("error", "") + "\n" + "\n".join(logs[-20:])
    return res


def test_async_init_on_the_main_thread(page_result):
    assert page_result["init"]["runtime"] == "pyodide"
    assert "wasm" in page_result["devices"]


def test_op_cases_pass_on_wasm_in_chromium(page_result):
    results = page_result["results"]
    ids = [c.id for c in op_cases.all_cases()]
    assert set(results) == set(ids)
    failures = [f"{cid}: {msg}" for cid, (status, msg) in results.items() if status == "fail"]
    passed = sum(1 for s, _ in results.values() if s == "pass")
    print(f"chromium [wasm]: {passed} passed, {len(ids) - passed - len(failures)} skipped, "
          f"{len(failures)} failed of {len(ids)}")
    assert not failures, f"{len(failures)} of {len(ids)} op cases fail on wasm in Chromium:\n" + \
        "\n".join(failures[:50])
