"""Fixtures for the browser tests: the built site, a live server, headless Chromium, a page.

- ``site_dir`` (session): ``$EMBER_SITE`` when build.py set it (``python build.py test``),
  otherwise the site is built now with build.py's own functions (wheel + site/).
- ``server`` (session): the real ember.web app under uvicorn, in a thread, on a free
  127.0.0.1 port; the value is the base URL (``http://127.0.0.1:PORT/``).
- ``request_log`` (session): every request the server received, as ``"/path?query"`` strings,
  in order (pages, workers, fetches alike); tests clear it and look at what a load asked for.
- ``browser`` (session): Debian's /usr/bin/chromium, headless, WebGPU on (SwiftShader).
- ``page`` (per test): a fresh context + page whose console errors and uncaught page errors
  fail the test at teardown (mark a test ``@pytest.mark.allow_console_errors`` to opt out);
  a failing test leaves a screenshot in e2e/artifacts/. Every page records the main thread's
  long tasks from navigation on (PerformanceObserver 'longtask', installed by an init script):
  ``long_tasks(page)`` returns them. ``page_without_webgpu``: the same in a Chromium started
  without WebGPU (``navigator.gpu`` is undefined on the page and in its workers).
- ``module_page`` (module) + ``shared_page``: one page that the tests of a module share (one
  Pyodide boot for them all); each test is judged by the console errors logged during it, as
  with ``page``:

    @pytest.fixture(scope="module")
    def _booted(module_page):
        module_page.goto("/")          # ... boot once
        return module_page

    @pytest.fixture
    def booted_page(_booted, shared_page, request):
        yield from shared_page(request, _booted)

  ``webgpu_ember_page``: the same for the whole session, the index with ember booted with
  WebGPU (``page.ember_info``: what ``load_ember(page, "/", webgpu=True)`` returned).

Helpers, handed out as fixtures (test files cannot import conftest by name: tests/ has one too):

- ``screenshot(page, name)``: save e2e/artifacts/<name>.png (gitignored).
- ``assert_cpu_fallback(page)``: a demo page shows its no-WebGPU notice, runs on the CPU and
  has the WebGPU radio button disabled.
- ``long_tasks(page)``: ``[{start, duration}]`` (ms) of every main-thread task over 50 ms so far.
- ``load_ember(page, path="/", webgpu=False)``: open ``path`` and boot ember there through
  /wasm/ember.js; returns ``pyodide.ember`` info (version, webgpu, timings). The page then
  has ``window.pyodide``; run Python with ``run_python(page, code)``.

    def test_x(page, load_ember, run_python):
        load_ember(page, "/demos/mnist/")
        assert run_python(page, "import ember; ember.tensor([1.0]).tolist()") == [1.0]
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
CHROMIUM = os.environ.get("EMBER_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--enable-unsafe-webgpu",  # the one flag that turns WebGPU on (SwiftShader adapter here)
    "--no-sandbox",
    # Without these Chromium keeps dialing out (updates, sync, field trials) on a box with no
    # internet, which costs time and can log errors.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
# Booting Pyodide on 2 busy cores: ~5 s alone, 10 s and more with other jobs running.
BOOT_TIMEOUT_MS = 120_000


def pytest_configure(config):
    config.addinivalue_line("markers", "allow_console_errors: do not fail the test on console "
                                       "errors or uncaught page errors")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # Keep each phase's report on the item so the page fixture can see whether the test failed.
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


def _load_build_module():
    spec = importlib.util.spec_from_file_location("ember_build", REPO / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def site_dir() -> Path:
    """The assembled site (see ember.web.site for its layout)."""
    env = os.environ.get("EMBER_SITE")
    if env:
        site = Path(env)
        if not (site / "manifest.json").is_file():
            pytest.fail(f"EMBER_SITE={env} is not a built ember site (no manifest.json)")
        return site
    build = _load_build_module()
    if not (Path(build.PYODIDE_DIR) / "pyodide.asm.wasm").is_file() and not shutil.which("npm"):
        pytest.skip("cannot build the site: Pyodide is not in wasm/node_modules and there is no "
                    "npm to fetch it (install Node.js 20+, then 'python build.py setup')")
    build.ensure_pyodide()
    return Path(build.build_site())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _RequestLog:
    """ASGI wrapper that notes every HTTP request's path and query before serving it."""

    def __init__(self, app):
        self.app = app
        self.entries: list = []

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            q = scope.get("query_string", b"").decode("latin-1")
            self.entries.append(scope["path"] + (f"?{q}" if q else ""))
        await self.app(scope, receive, send)


@pytest.fixture(scope="session")
def _logged_app(site_dir):
    from ember.web.app import create_app

    return _RequestLog(create_app(site_dir))


@pytest.fixture(scope="session")
def request_log(_logged_app) -> list:
    """The requests the server received (``"/path?query"``), in order; clear it with ``.clear()``."""
    return _logged_app.entries


@pytest.fixture(scope="session")
def server(_logged_app) -> str:
    """Base URL of the ember.web app serving ``site_dir``, e.g. ``http://127.0.0.1:41234/``."""
    import uvicorn

    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(_logged_app, host="127.0.0.1", port=port,
                                        log_level="warning", access_log=False))
    thread = threading.Thread(target=srv.run, name="ember-e2e-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            pytest.fail(f"the ember.web server did not start on 127.0.0.1:{port}")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/"
    srv.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="session")
def _playwright():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set EMBER_CHROMIUM)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright for Python is not installed (pip install playwright)")
    with sync_playwright() as pw:
        yield pw


@pytest.fixture(scope="session")
def browser(_playwright):
    """One headless Chromium for the whole session."""
    b = _playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
    yield b
    b.close()


@pytest.fixture(scope="session")
def browser_without_webgpu(_playwright):
    """A headless Chromium without --enable-unsafe-webgpu: no navigator.gpu anywhere, workers
    included (an init script can only hide it from the page itself)."""
    b = _playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=[a for a in CHROMIUM_ARGS if a != "--enable-unsafe-webgpu"])
    yield b
    b.close()


# Installed in every page before its own scripts: the main thread's long tasks (> 50 ms, the
# browser's threshold) from navigation on, for "the page never freezes" tests.
LONG_TASKS_SCRIPT = """
window.__longTasks = [];
try {
  new PerformanceObserver((list) => {
    for (const e of list.getEntries()) window.__longTasks.push({ start: e.startTime, duration: e.duration, name: e.name });
  }).observe({ type: "longtask", buffered: true });
} catch (e) { window.__longTasks = null; }
"""


# Fresh contexts would each make a memory snapshot in a background Worker (a second Pyodide
# boot) a moment after ember starts: on a 2-core runner that slows every other test. The
# snapshot's own tests (test_snapshot.py) open their pages without this.
NO_SNAPSHOT_SCRIPT = "globalThis.EMBER_SNAPSHOT = false;"


def _screenshot(page, name: str) -> Path:
    """Save a full-page screenshot to e2e/artifacts/<name>.png and return its path."""
    ARTIFACTS.mkdir(exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    path = ARTIFACTS / f"{safe}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def _new_page(browser, server, init_script=None, timeout_ms=BOOT_TIMEOUT_MS):
    """A fresh context + page that records its console lines and errors; returns both."""
    context = browser.new_context(base_url=server)
    context.add_init_script(LONG_TASKS_SCRIPT)
    context.add_init_script(NO_SNAPSHOT_SCRIPT)
    if init_script:
        context.add_init_script(init_script)
    p = context.new_page()
    p.set_default_timeout(timeout_ms)
    errors: list = []
    lines: list = []

    def on_console(msg):
        lines.append(f"{msg.type}: {msg.text}")
        if msg.type == "error":
            loc = msg.location or {}
            errors.append(f"console.error: {msg.text} ({loc.get('url', '?')}:{loc.get('lineNumber', '?')})")

    p.on("console", on_console)
    p.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
    p.console_errors = errors
    p.console_log = lines
    p.errors_checked = 0        # console_errors[:errors_checked] were already judged
    return context, p


def _after_test(p, request) -> None:
    """After one test on ``p``: on failure a screenshot and the console's last lines; the errors
    the page logged since the previous check fail the test (unless it allows them)."""
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        try:
            print(f"screenshot: {_screenshot(p, request.node.name)}")
            print("console:\n  " + "\n  ".join(p.console_log[-40:]))
        except Exception as e:  # a crashed page cannot be photographed; the failure says enough
            print(f"(no screenshot: {e})")
    new, p.errors_checked = p.console_errors[p.errors_checked:], len(p.console_errors)
    if new and not request.node.get_closest_marker("allow_console_errors"):
        pytest.fail("the page logged errors:\n  " + "\n  ".join(new), pytrace=False)


def _page(browser, server, request, init_script=None, timeout_ms=BOOT_TIMEOUT_MS):
    context, p = _new_page(browser, server, init_script, timeout_ms)
    yield p
    try:
        _after_test(p, request)
    finally:
        context.close()


@pytest.fixture
def page(browser, server, request):
    """A fresh page; console errors / page errors fail the test (see module docstring).

    ``page.console_errors`` lists what was seen so far; ``page.console_log`` every console line.
    """
    yield from _page(browser, server, request)


@pytest.fixture
def page_without_webgpu(browser_without_webgpu, server, request):
    """Like ``page``, in a browser without WebGPU (``navigator.gpu`` is undefined in the page
    and in its workers); pages on the CPU can take longer, hence the longer timeout."""
    yield from _page(browser_without_webgpu, server, request, timeout_ms=180_000)


@pytest.fixture(scope="module")
def module_page(browser, server):
    """One page for the tests of a module that share what is slow to set up (a Pyodide boot):
    a module fixture prepares it, a function fixture hands it to each test through
    ``shared_page(request, page)``, which judges each test by the errors logged during it (as
    ``page`` does) and leaves a screenshot when it fails. Errors logged after the module's
    last test fail its teardown."""
    context, p = _new_page(browser, server)
    yield p
    _close_shared(context, p)


def _close_shared(context, p) -> None:
    new = p.console_errors[p.errors_checked:]
    context.close()
    if new:
        pytest.fail("the shared page logged errors after its last test:\n  " + "\n  ".join(new), pytrace=False)


def _shared_page(request, p):
    # Errors logged while the module fixture set the page up, or between two tests, count
    # against the next test.
    yield p
    _after_test(p, request)


@pytest.fixture
def shared_page():
    """``yield from shared_page(request, module_page)`` in a function fixture: see ``module_page``."""
    return _shared_page


@pytest.fixture(scope="session")
def _webgpu_ember_session_page(browser, server):
    context, p = _new_page(browser, server)
    p.ember_info = _load_ember(p, "/", webgpu=True)
    yield p
    _close_shared(context, p)


@pytest.fixture
def webgpu_ember_page(_webgpu_ember_session_page, request):
    """The site's index with ember booted with WebGPU (``load_ember(page, "/", webgpu=True)``;
    its answer is ``page.ember_info``), one boot for the session's tests that take it; each is
    judged by the errors logged during it, as with ``shared_page``."""
    yield from _shared_page(request, _webgpu_ember_session_page)


def _load_ember(page, path: str = "/", webgpu=False) -> dict:
    """Open ``path`` (unless the page is already there) and boot ember in it via the loader.

    Returns ``pyodide.ember`` (``version``, ``webgpu``, ``webgpuError``, ``timings`` in ms since
    loadEmber was called), ``progress`` (the ``[label, fraction]`` pairs the loader reported) and
    ``openToReady``/``openToImported`` (ms from navigation start).
    """
    if urlparse(page.url).path != path:
        page.goto(path)
    info = page.evaluate(
        """async (webgpu) => {
            const t0 = performance.now();   // ms since navigation start
            const { loadEmber } = await import("/wasm/ember.js");
            const progress = [];
            window.pyodide = await loadEmber({ webgpu, onProgress: (p) => progress.push([p.label, p.fraction]) });
            const e = window.pyodide.ember;
            return { version: e.version, webgpu: e.webgpu, webgpuError: e.webgpuError,
                     timings: e.timings, progress,
                     openToReady: t0 + e.timings.pyodideReady,
                     openToImported: t0 + e.timings.emberImported };
        }""", webgpu)
    return info


def _run_python(page, code: str):
    """Run ``code`` with ``runPythonAsync`` in the page (after load_ember) and return its last
    expression converted to JS/JSON (use lists/str/float; PyProxies are converted with toJs)."""
    return page.evaluate(
        """async (code) => {
            const r = await window.pyodide.runPythonAsync(code);
            if (r && typeof r.toJs === "function") {
                const v = r.toJs({ dict_converter: Object.fromEntries });
                r.destroy();
                return v;
            }
            return r;
        }""", code)


CPU_LABELS = {"wasm": "CPU (WebAssembly SIMD)", "python": "CPU (pure Python)"}


def _assert_cpu_fallback(page) -> None:
    """A demo page without WebGPU says so, runs on the CPU and greys the WebGPU choice out.
    (Waits for the page's WebGPU start-up to end first: it happens after the page is ready.)"""
    done = page.evaluate("() => window.emberDemo.webgpuReady")
    assert done["ok"] is False, done
    notice = page.locator("#notice")
    assert notice.is_visible() and notice.get_attribute("data-kind") == "no-webgpu"
    assert "WebGPU is not available" in notice.inner_text() and "CPU" in notice.inner_text()
    cpu = page.evaluate("() => window.emberDemo.info.devices.cpu")
    assert page.locator("#backend-name").inner_text() == CPU_LABELS[cpu]
    assert page.locator("#backend-webgpu").is_disabled()


def _long_tasks(page) -> list:
    tasks = page.evaluate("() => window.__longTasks")
    assert tasks is not None, "this Chromium has no PerformanceObserver for 'longtask'"
    return tasks


@pytest.fixture(scope="session")   # helpers are plain functions: module fixtures use them too
def long_tasks():
    """``long_tasks(page) -> [{start, duration, name}]``: the page's main-thread tasks over 50 ms
    since navigation (ms, start relative to navigation)."""
    return _long_tasks


@pytest.fixture(scope="session")
def screenshot():
    """``screenshot(page, name) -> Path`` (e2e/artifacts/<name>.png)."""
    return _screenshot


@pytest.fixture(scope="session")
def load_ember():
    """``load_ember(page, path="/", webgpu=False) -> dict`` (see the module docstring)."""
    return _load_ember


@pytest.fixture(scope="session")
def run_python():
    """``run_python(page, code)`` -> the value of the last expression, converted to JS/JSON."""
    return _run_python


@pytest.fixture(scope="session")
def assert_cpu_fallback():
    """``assert_cpu_fallback(page)``: the demo page shows its no-WebGPU state (see the demos)."""
    return _assert_cpu_fallback
