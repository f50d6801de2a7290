"""What the in-page benchmarks (bench_llm.py, bench_web.py) share: the small HTTP server that
serves their pages with COOP/COEP, headless Chromium with the e2e suite's flags, a page whose
console is kept for the report, the one-line reason of a failure, and the chart (horizontal bars
on a log scale, drawn as SVG and screenshotted by the same Chromium).

Plain Python (no pytest, no ember): the benches import it from this folder; playwright is
imported by the callers (``sync_playwright``), never here.
"""
from __future__ import annotations

import ast
import email.utils
import http.server
import importlib.util
import json
import math
import os
import shutil
import socket
import subprocess
import threading
import urllib.parse
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

MIME = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
        ".mjs": "text/javascript; charset=utf-8", ".json": "application/json", ".wasm": "application/wasm",
        ".py": "text/x-python; charset=utf-8", ".whl": "application/zip", ".zip": "application/zip",
        ".css": "text/css; charset=utf-8", ".txt": "text/plain; charset=utf-8"}
# On every answer: the pages are cross-origin isolated (SharedArrayBuffer, so wasm threads work).
ISOLATION = {"Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp",
             "Cross-Origin-Resource-Policy": "same-origin"}


def serve(mounts: dict, overrides: dict | None = None, *, caching: bool = False):
    """A threaded HTTP server on 127.0.0.1 (a free port) with COOP/COEP on every answer: URL
    prefix -> folder (or URL -> one file), longest prefix first; files only, no listings, nothing
    above a mounted folder or in a dot folder. ``overrides`` (URL -> file, read at each request,
    so the caller may change it between pages) comes before the mounts. Every answer says
    ``Cache-Control: no-cache``, unless ``caching``: then files are answered as ember.web serves a
    site (what a revisit gets): validators on every file (ETag, Last-Modified; a matching
    If-None-Match gets 304), long caching for /pyodide/ and "?v=<hash>" URLs, revalidation for
    the rest. Returns (server, base URL); ``server.shutdown()`` stops it."""
    overrides = {} if overrides is None else overrides
    order = sorted(((k, Path(v).resolve()) for k, v in mounts.items()), key=lambda kv: -len(kv[0]))

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):   # quiet
            pass

        def _file(self):
            path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
            if path in overrides:
                return Path(overrides[path])
            for prefix, root in order:
                if root.is_file():
                    if path == prefix:
                        return root
                    continue
                if not path.startswith(prefix):
                    continue
                rel = path[len(prefix):]
                if any(part.startswith(".") for part in rel.split("/") if part):
                    return None
                f = (root / rel).resolve()
                if f.is_dir():
                    f = f / "index.html"
                return f if (f == root or root in f.parents) and f.is_file() else None
            return None

        def _answer(self, code, headers):
            self.send_response(code)
            for k, v in headers:
                self.send_header(k, v)
            for k, v in ISOLATION.items():
                self.send_header(k, v)
            self.end_headers()

        def do_GET(self):
            f = self._file()
            no_cache = [] if caching else [("Cache-Control", "no-cache")]
            if f is None:
                self._answer(404, [("Content-Type", "text/plain"), ("Content-Length", "10"), *no_cache])
                self.wfile.write(b"not found\n")
                return
            st = f.stat()
            headers = [("Content-Type", MIME.get(f.suffix, "application/octet-stream")),
                       ("Content-Length", str(st.st_size)), *no_cache]
            if caching:
                etag = f'"{st.st_size:x}-{st.st_mtime_ns:x}"'
                if self.headers.get("If-None-Match") == etag:
                    self._answer(304, [("ETag", etag)])
                    return
                split = urllib.parse.urlsplit(self.path)
                long = split.path.startswith("/pyodide/") or "v=" in split.query
                headers += [("ETag", etag), ("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True)),
                            ("Cache-Control", "public, max-age=31536000, immutable" if long else "no-cache")]
            self._answer(200, headers)
            with open(f, "rb") as fh:
                shutil.copyfileobj(fh, self.wfile, 1 << 20)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, name="bench-page-server", daemon=True).start()
    return srv, f"http://127.0.0.1:{port}"


def load_module(path: Path, name: str):
    """The Python file ``path`` imported as module ``name`` (build.py, a demo's helper): the
    benches run from any folder, not as a package."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def npm_package(folder: Path, name: str, version: str, log) -> None:
    """npm package ``name`` at ``version`` in ``folder``/node_modules (the bench's package.json in
    ``folder`` pins it): ``npm install`` there, saying so through ``log``, when it is missing or
    another version. RuntimeError where there is no npm or it installed another version."""
    pkg = folder / "node_modules" / name / "package.json"
    if pkg.is_file() and json.loads(pkg.read_text()).get("version") == version:
        return
    npm = shutil.which("npm")
    if not npm:
        raise RuntimeError(f"npm is needed to install {name} (Node.js 20+)")
    log(f"installing {name}@{version} into {folder.relative_to(REPO)}/node_modules")
    subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(folder)], check=True)
    got = json.loads(pkg.read_text()).get("version")
    if got != version:
        raise RuntimeError(f"npm installed {name} {got}, not {version}")


def given_site(site: str | None, who: str) -> Path | None:
    """The built ember site that ``site`` (--site) or else $EMBER_SITE names, None where neither
    does; SystemExit (``who`` first) where it is not one (no manifest.json)."""
    given = site or os.environ.get("EMBER_SITE")
    if not given:
        return None
    p = Path(given)
    if not (p / "manifest.json").is_file():
        raise SystemExit(f"{who}: {p} is not a built ember site (no manifest.json)")
    return p


# ---- the browser ------------------------------------------------------------------------------

def chromium() -> str:
    """The Chromium the benches drive: $EMBER_CHROMIUM, else /usr/bin/chromium."""
    return os.environ.get("EMBER_CHROMIUM", "/usr/bin/chromium")


def chromium_args() -> list:
    """The e2e suite's flags (WebGPU on, no dialing out), read from the one place they are
    written, e2e/conftest.py (without importing it: it needs pytest)."""
    tree = ast.parse((REPO / "e2e" / "conftest.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "CHROMIUM_ARGS" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise RuntimeError("e2e/conftest.py has no CHROMIUM_ARGS")


def launch(pw, args: list | None = None):
    """Headless ``chromium()`` from playwright ``pw`` with ``args`` (default: ``chromium_args()``)."""
    return pw.chromium.launch(executable_path=chromium(), headless=True,
                              args=chromium_args() if args is None else args)


def watched_page(ctx):
    """(a new page of browser context ``ctx``, the list its console messages and uncaught errors
    go to, as "type: text" and "pageerror: ..." lines)."""
    page = ctx.new_page()
    console = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    return page, console


def wait_result(page, var: str, timeout_s: float):
    """``window[var]`` once the page has set it (polled every 250 ms; playwright's TimeoutError
    after ``timeout_s``)."""
    page.wait_for_function(f"window.{var} !== undefined", timeout=timeout_s * 1000, polling=250)
    return page.evaluate(f"window.{var}")


def reason(e: BaseException, n: int = 200) -> str:
    """A failure as one report cell: the exception's type and the first ``n`` characters of its
    message's first line."""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:n] if str(e) else ''}"


# ---- the chart --------------------------------------------------------------------------------

def log_panels(panels: list, *, width: int, left: int, right: int, bar_h: int, gap: int, tick, bar,
               y: int = 60) -> tuple:
    """The panels of a horizontal bar chart on one log-scale axis (decades around every value):
    ``panels`` is [(title, [(row, value), ...])], a panel without bars is left out; each panel
    gets its title, the decade grid (``tick(k)`` labels line k) and one bar line per entry,
    ``bar(title, row, value, y, x)`` returning its SVG elements (``x(value)``: the value's x).
    Starts at ``y``; returns (SVG elements, the y below the last panel)."""
    vals = [v for _, bars in panels for _, v in bars if v]
    lo = 10 ** math.floor(math.log10(min(vals))) if vals else 0.1
    hi = 10 ** math.ceil(math.log10(max(vals))) if vals else 1000
    if hi <= lo:
        hi = lo * 10
    span = width - left - right

    def x(v):
        return left + span * (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))

    parts = []
    for title, bars in panels:
        if not bars:
            continue
        y += 22
        parts.append(f'<text x="10" y="{y}" font-size="14" font-weight="600">{title}</text>')
        y += 8
        top, bottom = y, y + len(bars) * (bar_h + gap)
        k = lo
        while k <= hi * 1.0001:   # grid first, bars over it
            parts.append(f'<line x1="{x(k):.1f}" y1="{top - 2}" x2="{x(k):.1f}" y2="{bottom}" stroke="#ddd"/>')
            parts.append(f'<text x="{x(k):.1f}" y="{bottom + 12}" font-size="10" text-anchor="middle" '
                         f'fill="#666">{tick(k)}</text>')
            k *= 10
        for r, v in bars:
            parts += bar(title, r, v, y, x)
            y += bar_h + gap
        y = bottom + 14
    return parts, y


def svg_document(width: int, height: int, parts: list) -> str:
    """The chart's SVG elements on a white page of ``width`` x ``height``."""
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'font-family="DejaVu Sans, sans-serif"><rect width="100%" height="100%" fill="white"/>'
            + "".join(parts) + "</svg>")


def screenshot_svg(browser, svg: str, path: Path) -> None:
    """The SVG rendered by ``browser`` (a fresh context, device scale 1) into the PNG ``path``."""
    ctx = browser.new_context(device_scale_factor=1)
    page = ctx.new_page()
    page.set_content(f"<!doctype html><html><body style='margin:0'>{svg}</body></html>")
    page.locator("svg").screenshot(path=str(path))
    ctx.close()
