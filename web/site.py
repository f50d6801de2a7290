"""Assemble the static site that `python -m ember.web` serves.

    python -m ember.web.site --wheel dist/ember-0.1.0-py3-none-any.whl --out site

Site layout (every URL is a plain file under the output folder):

    /                       index.html: the list of demos (title and description of each)
    /favicon.ico            a small icon, so no page logs a 404 for it
    /manifest.json          {"ember_version", "wheel", "wheel_sha256", "extra_wheels",
                            "pyodide_version", "pyodide_python", "demos", "files", "snapshot"}
                            read by /wasm/ember.js to find the wheels; "files" maps every demo
                            file's and extra wheel's site path to the first 16 hex digits of its
                            sha256, so pages ask for "<file>?v=<hash>" (one exact content: the
                            browser may keep it, in the Cache API, and the server says it may)
    /pyodide/               the npm `pyodide` package's runtime files (pyodide.mjs, pyodide.asm.mjs,
                            pyodide.asm.wasm, python_stdlib.zip, pyodide-lock.json, ...)
    /wheels/ember-<version>-py3-none-any.whl
    /wheels/ember-<sha16>-pyc.zip
                            ember's modules compiled by the served Pyodide (unchecked-hash .pyc,
                            made with Node at build time; manifest "wheel_pyc"), unpacked over
                            the wheel by the loader: a first visit imports without compiling
    /wheels/ember-<sha16>-snapshot.bin
                            a Pyodide memory snapshot after `import ember` (wasm/snapshot.js's
                            packed format; <sha16>: its SHA-256), made with headless Chromium at
                            build time (``prebuild_snapshot``; manifest "snapshot"): a first visit
                            restores it instead of booting Python (~5 s -> ~1.5 s to the first
                            MNIST answer here); none when Playwright or Chromium is missing
                            (``--no-snapshot`` leaves it out)
    /wheels/<other>-py3-none-any.whl
                            extra pure-Python wheels ember needs in the page (e.g. jinja2 and
                            markupsafe for chat templates): every such wheel of the extra wheels
                            folder (``--extra-wheels``, default ``.cache/site-wheels``, filled by
                            demos/chat/prepare.py); /wasm/ember.js installs them before
                            ``import ember``
    /wasm/ember.js          the loader (see its header for the API); /wasm/snapshot.js its
                            memory snapshots (boots a revisit from the heap after `import ember`)
    /wasm/demo-kit.js       page code the demos share; /wasm/demo.css their shared look
    /demos/<name>/...       a copy of demos/<name>/ (page, model .py, .safetensors weights, .js)

Every compressible file (``COMPRESSIBLE``) of at least ``PRECOMPRESS_MIN_BYTES`` also gets a
gzip copy next to it, ``<file>.gz`` with the same modification time, written once at build time
(and again only when the file changes): the server sends it to clients that accept gzip instead
of compressing big files per request.

A demo is listed on the index when its folder has an index.html; its `<title>` and
`<meta name="description">` give the entry. A page with `<meta name="ember-kind"
content="example">` (how-to pages such as demos/embed/) is listed after the demos. Copying skips __pycache__, node_modules, dot-files
and *.pyc, plus the glob patterns (one per line, matched against the path inside the demo and
against the file name) listed in an optional `demos/<name>/.siteignore` -- e.g. training data.

Rebuilding syncs the folder: unchanged files keep their modification time (so browsers'
cached copies stay valid) and files no longer wanted are removed. The output folder must be
empty, absent, or an earlier site (it has manifest.json); anything else is refused.
"""
from __future__ import annotations

import argparse
import fnmatch
import gzip
import hashlib
import html
import json
import os
import re
import shutil
import struct
import sys
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent          # the source tree (web/ is ember.web)
WASM_DIR = REPO / "wasm"
DEFAULT_PYODIDE = WASM_DIR / "node_modules" / "pyodide"
DEFAULT_DEMOS = REPO / "demos"
# Extra pure-Python wheels the site serves and the loader installs next to ember (dependencies
# Pyodide does not ship, e.g. jinja2): every *-py3-none-any.whl found here.
DEFAULT_EXTRA_WHEELS = Path(os.environ.get("EMBER_CACHE", REPO / ".cache")) / "site-wheels"

PYC_CACHE = Path(os.environ.get("EMBER_CACHE", REPO / ".cache")) / "site-pyc"
# Run inside Pyodide (Node) by precompile_wheel: compiles the ember modules a page imports on its
# way to a first answer (`import ember` and wasm/snapshot.js's PRELOAD list) to unchecked-hash
# .pyc files (valid whatever the sources' mtimes after the page unpacks the wheel) and zips them.
# Modules imported later compile from source as before (a smaller download).
_PYC_SCRIPT = """
import importlib, os, py_compile, site, sys, zipfile
sp = site.getsitepackages()[0]
for m in ["ember"] + sys.argv[2].split(","):
    try:
        importlib.import_module(m)
    except Exception:
        pass
with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_DEFLATED) as z:
    for name, mod in sorted(sys.modules.items()):
        src = getattr(mod, "__file__", None) or ""
        if (name == "ember" or name.startswith("ember.")) and src.endswith(".py") and src.startswith(sp):
            pyc = py_compile.compile(src, doraise=True,
                                     invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
            z.write(pyc, os.path.relpath(pyc, sp))
"""
# wasm/snapshot.js's PRELOAD (the imports a snapshot holds beyond `import ember`).
_PYC_PRELOAD = ("ember.nn,ember.io,ember.io.safetensors,ember.wasm.runtime,ember.wasm.backend,"
                "ember.wasm.plan_exec,ember.wasm.team,ember.backends.python,ember.onnx,ember.webgpu,"
                "ember.wasm.ops_cast,ember.wasm.ops_elementwise,ember.wasm.ops_layout,ember.wasm.ops_linalg,"
                "ember.wasm.ops_quant,ember.wasm.ops_reduce")


def precompile_wheel(wheel: Path, sha: str) -> Path | None:
    """A zip of ember's modules compiled by the Pyodide the site serves (its Python, its magic
    number), to unpack over the wheel in the page: a first visit then imports ember without
    compiling its sources (`import ember` ~3x faster). Made with Node (wasm/run_pyodide.mjs)
    once per wheel content, cached in ``PYC_CACHE``; None (with a note) when Node or the
    runner is missing or the compilation fails -- the page then compiles as before."""
    import shutil
    import subprocess
    import tempfile

    out = PYC_CACHE / f"ember-{sha[:16]}-pyc.zip"
    if out.is_file():
        return out
    node, runner = shutil.which("node"), WASM_DIR / "run_pyodide.mjs"
    if not node or not runner.is_file():
        print("[site] no .pyc bundle: node or wasm/run_pyodide.mjs is missing", flush=True)
        return None
    PYC_CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "pyc.py"
        script.write_text(_PYC_SCRIPT)
        r = subprocess.run([node, str(runner), "--wheel", str(wheel), "--mount", f"{tmp}:/out",
                            str(script), "/out/pyc.zip", _PYC_PRELOAD], capture_output=True, text=True, timeout=600)
        if r.returncode or not (Path(tmp) / "pyc.zip").is_file():
            print(f"[site] no .pyc bundle: compiling in Pyodide failed: {(r.stderr or r.stdout)[-300:]}", flush=True)
            return None
        shutil.move(str(Path(tmp) / "pyc.zip"), out)
    return out


SNAPSHOT_CACHE = Path(os.environ.get("EMBER_CACHE", REPO / ".cache")) / "site-snapshot"
# Run in headless Chromium on the freshly built site by prebuild_snapshot: wasm/snapshot.js's own
# maker (a Worker booting a throwaway Pyodide with `_makeSnapshot`, the wheels unpacked, `import
# ember` and its PRELOAD), nothing stored in the browser; the packed body comes back as a download.
_SNAPSHOT_PAGE_JS = """async () => {
    const snap = await import("/wasm/snapshot.js");
    const base = location.origin + "/";
    const manifest = await (await fetch(base + "manifest.json", { cache: "no-cache" })).json();
    const get = async (p) => new Uint8Array(await (await fetch(new URL(p, base))).arrayBuffer());
    const pyc = manifest.wheel_pyc && manifest.wheel_pyc_for === manifest.wheel_sha256 ? [manifest.wheel_pyc] : [];
    const wheels = await Promise.all([manifest.wheel, ...(manifest.extra_wheels || []), ...pyc].map(get));
    const r = await snap.makeSnapshot(base, manifest, wheels, { store: false });
    if (!r.ok) return { ok: false, error: r.error };
    const a = document.createElement("a");
    a.href = URL.createObjectURL(new Blob([r.body]));
    a.download = "snapshot.bin";
    document.body.append(a);
    a.click();
    return { ok: true, record: r.record, ms: r.ms };
}"""


_SNAPSHOT_MAKER_VERSION = 2   # bump when how prebuild_snapshot makes one changes (part of its key)
SNAPSHOT_CACHE_KEEP = 3       # prebuilt snapshots kept in SNAPSHOT_CACHE (the newest)


def _serve_folder(root: Path):
    """A threaded static server for ``root`` only, on 127.0.0.1 (a secure context for the Cache
    API and WebCrypto), cross-origin isolated like the served site (the snapshot is made in the
    environment pages restore it in); returns (server, base URL). Used for a few seconds at
    build time."""
    import functools
    import http.server
    import threading

    class Handler(http.server.SimpleHTTPRequestHandler):
        extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                          ".js": "text/javascript", ".mjs": "text/javascript", ".wasm": "application/wasm",
                          ".json": "application/json"}

        def end_headers(self):   # cross-origin isolated, as ember.web serves the site
            for k, v in ISOLATION.items():
                self.send_header(k, v)
            super().end_headers()

        def log_message(self, *args):   # quiet
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, name="site-snapshot-server", daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/"


def snapshot_key(manifest: dict, loader: Path = WASM_DIR / "snapshot.js") -> str:
    """What a prebuilt snapshot depends on: this Pyodide, the wheels the page installs (ember's,
    the extras, the .pyc bundle) and the maker (wasm/snapshot.js: its FORMAT and PRELOAD)."""
    parts = {"pyodide": manifest["pyodide_version"], "wheel": manifest["wheel_sha256"],
             "extras": {w: manifest["files"].get(w) for w in manifest.get("extra_wheels", [])},
             "pyc": manifest["files"].get(manifest.get("wheel_pyc", ""), None),
             "maker": _sha256(loader), "page": _SNAPSHOT_MAKER_VERSION}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def prebuild_snapshot(site: Path, manifest: dict, *, timeout_s: float = 300) -> tuple[Path, dict] | None:
    """A Pyodide memory snapshot after `import ember` for first visits (wasm/snapshot.js), made by
    headless Chromium (Playwright, ``$EMBER_CHROMIUM`` or /usr/bin/chromium) on ``site`` -- the
    site already synced with ``manifest`` -- once per ``snapshot_key``, cached in
    ``SNAPSHOT_CACHE``. Returns (packed body file, record {meta, bytes, body, sha256}), or None
    with a note when no browser is available or the making fails: the site then has no prebuilt
    snapshot and pages boot as before (and make their own)."""
    import time

    key = snapshot_key(manifest)[:32]
    body, rec = SNAPSHOT_CACHE / f"{key}.bin", SNAPSHOT_CACHE / f"{key}.json"
    if body.is_file() and rec.is_file():
        record = json.loads(rec.read_text())
        if body.stat().st_size == record.get("body"):
            return body, record
    chromium = os.environ.get("EMBER_CHROMIUM", "/usr/bin/chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("[site] no prebuilt snapshot: Playwright is not installed", flush=True)
        return None
    if not Path(chromium).is_file():
        print(f"[site] no prebuilt snapshot: no Chromium at {chromium} (set EMBER_CHROMIUM)", flush=True)
        return None
    t0 = time.monotonic()
    srv, base = _serve_folder(site)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, headless=True,
                                         args=["--no-sandbox", "--disable-background-networking",
                                               "--disable-component-update", "--no-first-run"])
            try:
                page = browser.new_context(accept_downloads=True).new_page()
                page.set_default_timeout(timeout_s * 1000)
                page.goto(base + "index.html")
                with page.expect_download(timeout=timeout_s * 1000) as dl:
                    r = page.evaluate(_SNAPSHOT_PAGE_JS)
                    if not r["ok"]:
                        raise RuntimeError(r["error"])
                SNAPSHOT_CACHE.mkdir(parents=True, exist_ok=True)
                tmp = body.with_name(body.name + ".part")
                dl.value.save_as(tmp)
            finally:
                browser.close()
    except Exception as e:   # a missing browser build, a crash, a timeout: no prebuilt snapshot
        print(f"[site] no prebuilt snapshot: making it failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
        return None
    finally:
        srv.shutdown()
    record = r["record"]
    if tmp.stat().st_size != record["body"] or _sha256(tmp) != record["sha256"]:
        tmp.unlink()
        print("[site] no prebuilt snapshot: the downloaded body does not match its record", flush=True)
        return None
    os.replace(tmp, body)
    rec.write_text(json.dumps(record, indent=1) + "\n")
    # ~17 MB each, one per wheel content: keep the newest few
    for old in sorted(SNAPSHOT_CACHE.glob("*.bin"), key=lambda p: p.stat().st_mtime)[:-SNAPSHOT_CACHE_KEEP]:
        old.unlink(missing_ok=True)
        old.with_suffix(".json").unlink(missing_ok=True)
    print(f"[site] prebuilt snapshot: {record['bytes'] >> 20} MB heap, {record['body'] >> 20} MB stored, "
          f"made in {time.monotonic() - t0:.1f} s", flush=True)
    return body, record


# The npm package also ships docs, typings and a console page; the runtime needs none of them.
PYODIDE_SKIP = ("README.md", "*.d.ts", "*.html")
DEMO_SKIP_DIRS = {"__pycache__", "node_modules"}
DEMO_SKIP_FILES = ("*.pyc", "*.pyo")
# Worth compressing (ember.web.app serves these gzipped): text, wasm (~3x smaller) and weights
# (float data shrinks a little; on a slow link that is still seconds). Zip-like files are
# compressed already.
COMPRESSIBLE = {".html", ".htm", ".js", ".mjs", ".css", ".json", ".map", ".wasm", ".safetensors",
                ".bin", ".onnx", ".py", ".wgsl", ".txt", ".md", ".svg"}
PRECOMPRESS_MIN_BYTES = 256 << 10
# Headers on every answer of a site (ember.web.app) and of the build-time server that makes its
# snapshot: cross-origin isolated (SharedArrayBuffer for the wasm threads), nothing pulled off-site
ISOLATION = {
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "require-corp",
    "Cross-Origin-Resource-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
}


class _Gzip:
    """A ``files`` entry of ``_sync``: the gzip of the site file ``rel`` (written after it)."""

    def __init__(self, rel: str):
        self.rel = rel


def _write_gzip(src: Path, dst: Path) -> None:
    """``dst`` = gzip of ``src`` (deterministic: no name, mtime 0 in the header) with ``src``'s
    modification time, which is how the server knows it was made from this content. Not
    written when it would not be smaller."""
    st = src.stat()
    if dst.is_file() and not dst.is_symlink() and dst.stat().st_mtime_ns == st.st_mtime_ns:
        return
    tmp = dst.with_name(dst.name + ".tmp")
    with open(src, "rb") as f, open(tmp, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=6, mtime=0) as z:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                z.write(chunk)
    if tmp.stat().st_size >= st.st_size:
        tmp.unlink()
        if dst.exists() or dst.is_symlink():
            dst.unlink()
        return
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp, dst)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _png(size: int, rgba) -> bytes:
    """A one-colour disc as a PNG (pure Python; the favicon)."""
    c = (size - 1) / 2
    rows = b""
    for y in range(size):
        row = bytearray(b"\x00")  # filter byte: none
        for x in range(size):
            inside = (x - c) ** 2 + (y - c) ** 2 <= (size / 2 - 0.5) ** 2
            row += bytes(rgba) if inside else b"\x00\x00\x00\x00"
        rows += bytes(row)

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    ihdr = struct.pack(">IIBBBBB", size, size, 8, 6, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows, 9))
            + chunk(b"IEND", b""))


def favicon() -> bytes:
    """An .ico holding one 32x32 PNG (browsers accept PNG inside ICO)."""
    png = _png(32, (234, 88, 12, 255))
    return struct.pack("<HHH", 0, 1, 1) + struct.pack("<BBBBHHII", 32, 32, 0, 0, 1, 32, len(png), 22) + png


def _demo_info(folder: Path) -> dict | None:
    page = folder / "index.html"
    if not page.is_file():
        return None
    text = page.read_text(encoding="utf-8", errors="replace")
    title = re.search(r"<title>(.*?)</title>", text, re.S | re.I)
    desc = re.search(r'<meta\s+name="description"\s+content="(.*?)"', text, re.S | re.I)
    kind = re.search(r'<meta\s+name="ember-kind"\s+content="(.*?)"', text, re.S | re.I)
    return {"name": folder.name,
            "title": html.unescape(title.group(1).strip()) if title else folder.name,
            "description": html.unescape(desc.group(1).strip()) if desc else "",
            "kind": kind.group(1).strip() if kind else "demo",
            "url": f"demos/{folder.name}/"}


def _ignored(rel: str, patterns) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(name, p) for p in patterns)


def _demo_files(folder: Path) -> dict:
    """{path inside the demo: source file} for one demo folder."""
    patterns = list(DEMO_SKIP_FILES)
    ignore = folder / ".siteignore"
    if ignore.is_file():
        patterns += [ln.strip() for ln in ignore.read_text().splitlines()
                     if ln.strip() and not ln.startswith("#")]
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        base = Path(dirpath)
        rel_dir = base.relative_to(folder).as_posix()
        dirnames[:] = sorted(d for d in dirnames if d not in DEMO_SKIP_DIRS and not d.startswith(".")
                             and not _ignored(f"{rel_dir}/{d}".lstrip("./"), patterns))
        for fn in sorted(filenames):
            rel = fn if rel_dir == "." else f"{rel_dir}/{fn}"
            if fn.startswith(".") or _ignored(rel, patterns) or not (base / fn).is_file():
                continue
            out[rel] = base / fn
    return out


INDEX_TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>ember demos</title>
<link rel="icon" href="favicon.ico">
<style>
  body {{ font: 16px/1.5 system-ui, sans-serif; max-width: 44rem; margin: 3rem auto; padding: 0 1rem; color: #222; }}
  h1 {{ font-weight: 600; margin-bottom: .2rem; }}
  h1 span {{ color: #ea580c; }}
  p.lead {{ color: #555; margin-top: 0; }}
  ul {{ list-style: none; padding: 0; }}
  li {{ border: 1px solid #ddd; border-radius: 8px; padding: .8rem 1rem; margin: .7rem 0; }}
  li a {{ font-weight: 600; color: #c2410c; text-decoration: none; }}
  li a:hover {{ text-decoration: underline; }}
  li p {{ margin: .2rem 0 0; color: #555; }}
  footer {{ margin-top: 2rem; color: #777; font-size: 14px; }}
  code {{ background: #f4f4f4; padding: 0 .25rem; border-radius: 3px; }}
</style>
</head>
<body>
<h1><span>ember</span> demos</h1>
<p class="lead">Python models running in this page: Pyodide (Python {pyodide_python}) on the CPU or WebGPU,
no server-side compute, nothing fetched from the internet.</p>
<ul id="demos">
{items}
</ul>
<footer>ember {version} &middot; Pyodide {pyodide_version} &middot; wheel
<a href="{wheel}"><code>{wheel_name}</code></a> &middot; loader <a href="wasm/ember.js"><code>wasm/ember.js</code></a></footer>
</body>
</html>
"""


def _index_html(manifest: dict) -> str:
    items = "\n".join(
        f'<li><a href="{html.escape(d["url"])}">{html.escape(d["title"])}</a>'
        + (f'<p>{html.escape(d["description"])}</p>' if d["description"] else "") + "</li>"
        for d in manifest["demos"]) or "<li>No demos found.</li>"
    return INDEX_TEMPLATE.format(items=items, version=html.escape(manifest["ember_version"]),
                                 pyodide_version=html.escape(manifest["pyodide_version"]),
                                 pyodide_python=html.escape(manifest["pyodide_python"]),
                                 wheel=html.escape(manifest["wheel"]),
                                 wheel_name=html.escape(manifest["wheel"].rsplit("/", 1)[-1]))


def _sync(out: Path, files: dict) -> None:
    """Make `out` hold exactly `files` ({relative path: source Path, bytes, or _Gzip})."""
    for rel, src in files.items():
        dst = out / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(src, _Gzip):
            continue
        if isinstance(src, bytes):
            if not (dst.is_file() and dst.read_bytes() == src):
                dst.write_bytes(src)
            continue
        st = src.stat()
        if dst.is_file() and not dst.is_symlink():
            dt = dst.stat()
            if dt.st_size == st.st_size and dt.st_mtime_ns == st.st_mtime_ns:  # copy2 kept it
                continue
        if dst.is_symlink() or dst.exists():
            dst.unlink()
        shutil.copy2(src, dst)
    for rel, src in files.items():   # after the copies: a .gz takes its file's mtime
        if isinstance(src, _Gzip):
            _write_gzip(out / src.rel, out / rel)
    wanted = {(out / rel) for rel in files}
    for dirpath, dirnames, filenames in os.walk(out, topdown=False):
        for fn in filenames:
            p = Path(dirpath) / fn
            if p not in wanted:
                p.unlink()
        for d in dirnames:
            p = Path(dirpath) / d
            if p.is_symlink():
                p.unlink()
            elif not any(p.iterdir()):
                p.rmdir()


def build_site(wheel: str | os.PathLike, out: str | os.PathLike, *,
               pyodide_dir: str | os.PathLike = DEFAULT_PYODIDE,
               demos_dir: str | os.PathLike = DEFAULT_DEMOS,
               extra_wheels_dir: str | os.PathLike | None = None, precompile: bool = False,
               snapshot: bool = False) -> Path:
    """Assemble the site into `out` and return its path. `extra_wheels_dir`: a folder whose
    ``*-py3-none-any.whl`` files are served too and installed next to ember by the loader (the
    command line's default is ``DEFAULT_EXTRA_WHEELS``; None or a missing folder: none).
    `precompile`: also serve ember's modules compiled by this Pyodide (``precompile_wheel``;
    the command line's default), listed in the manifest as ``wheel_pyc`` together with the
    wheel's sha256 it was made from (``wheel_pyc_for``); the loader uses it for that wheel only.
    `snapshot`: also serve a Pyodide memory snapshot after `import ember` for first visits
    (``prebuild_snapshot``; the command line's default), listed in the manifest as ``snapshot``
    ({path, bytes, body, sha256, meta}); none when no headless Chromium is available.

    >>> # build_site("dist/ember-0.1.0-py3-none-any.whl", "site")  # doctest: +SKIP
    """
    wheel, out = Path(wheel), Path(out)
    pyodide_dir, demos_dir = Path(pyodide_dir), Path(demos_dir)
    if not wheel.is_file() or not re.fullmatch(r"ember-[^-]+-py3-none-any\.whl", wheel.name):
        raise SystemExit(f"ember.web.site: {wheel} is not an ember-<version>-py3-none-any.whl file; "
                         "build it with 'python build.py wheel'")
    if not (pyodide_dir / "pyodide.asm.wasm").is_file():
        raise SystemExit(f"ember.web.site: no Pyodide in {pyodide_dir} (pyodide.asm.wasm missing); "
                         "run 'python build.py setup' (npm install pyodide)")
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "manifest.json").is_file())):
        raise SystemExit(f"ember.web.site: refusing to write into {out}: it is not empty and not an "
                         "earlier ember site (no manifest.json)")

    pyodide_version = json.loads((pyodide_dir / "package.json").read_text())["version"]
    try:
        python_version = json.loads((pyodide_dir / "pyodide-lock.json").read_text())["info"]["python"]
    except (OSError, ValueError, KeyError, TypeError):
        python_version = "?"
    files: dict = {}
    for p in sorted(pyodide_dir.iterdir()):
        if p.is_file() and not any(fnmatch.fnmatch(p.name, pat) for pat in PYODIDE_SKIP):
            files[f"pyodide/{p.name}"] = p
    files[f"wheels/{wheel.name}"] = wheel
    extra_wheels, hashes = [], {}
    if extra_wheels_dir is not None and Path(extra_wheels_dir).is_dir():
        for p in sorted(Path(extra_wheels_dir).glob("*-py3-none-any.whl")):
            if p.is_file() and not p.name.startswith("ember-"):
                files[f"wheels/{p.name}"] = p
                extra_wheels.append(f"wheels/{p.name}")
                hashes[f"wheels/{p.name}"] = _sha256(p)[:16]
    for p in sorted(WASM_DIR.glob("*.js")) + sorted(WASM_DIR.glob("*.css")):  # loader, demo kit
        files[f"wasm/{p.name}"] = p

    demos = []
    if demos_dir.is_dir():
        for folder in sorted(demos_dir.iterdir()):
            if not folder.is_dir() or folder.name.startswith((".", "_")):
                continue
            for rel, src in _demo_files(folder).items():
                files[f"demos/{folder.name}/{rel}"] = src
                hashes[f"demos/{folder.name}/{rel}"] = _sha256(src)[:16]
            info = _demo_info(folder)
            if info:
                demos.append(info)
    demos.sort(key=lambda d: d["kind"] != "demo")   # the demos first, then examples (stable: by name)

    wheel_sha = _sha256(wheel)
    pyc = precompile_wheel(wheel, wheel_sha) if precompile else None
    if pyc is not None:
        files[f"wheels/{pyc.name}"] = pyc
        hashes[f"wheels/{pyc.name}"] = _sha256(pyc)[:16]
    manifest = {"ember_version": wheel.name.split("-")[1], "wheel": f"wheels/{wheel.name}",
                "wheel_sha256": wheel_sha, "extra_wheels": extra_wheels,
                **({"wheel_pyc": f"wheels/{pyc.name}", "wheel_pyc_for": wheel_sha} if pyc else {}),
                "pyodide_version": pyodide_version,
                "pyodide_python": python_version,
                "demos": demos, "files": hashes}

    def with_manifest(manifest: dict) -> dict:
        out_files = {**files, "manifest.json": (json.dumps(manifest, indent=2) + "\n").encode(),
                     "index.html": _index_html(manifest).encode(), "favicon.ico": favicon()}
        for rel, src in list(out_files.items()):
            size = len(src) if isinstance(src, bytes) else src.stat().st_size
            if Path(rel).suffix.lower() in COMPRESSIBLE and size >= PRECOMPRESS_MIN_BYTES:
                out_files[rel + ".gz"] = _Gzip(rel)
        return out_files

    out.mkdir(parents=True, exist_ok=True)
    if snapshot:
        key = snapshot_key(manifest)[:32]
        cached = SNAPSHOT_CACHE / f"{key}.bin"
        if not cached.is_file():   # the maker runs on the site as it will be served, less the snapshot
            _sync(out, with_manifest(manifest))
        made = prebuild_snapshot(out, manifest)
        if made is not None:
            body, record = made
            rel = f"wheels/ember-{record['sha256'][:16]}-snapshot.bin"
            files[rel] = body
            manifest = {**manifest, "files": {**hashes, rel: record["sha256"][:16]},
                        "snapshot": {"path": rel, **record}}
    _sync(out, with_manifest(manifest))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ember.web.site", description=__doc__.split("\n")[0])
    ap.add_argument("--wheel", required=True, help="the built ember-<version>-py3-none-any.whl")
    ap.add_argument("--out", required=True, help="output folder (created; an earlier site is synced)")
    ap.add_argument("--pyodide", default=str(DEFAULT_PYODIDE), help="the npm pyodide package folder")
    ap.add_argument("--demos", default=str(DEFAULT_DEMOS), help="the demos folder")
    ap.add_argument("--extra-wheels", default=str(DEFAULT_EXTRA_WHEELS),
                    help="folder of extra py3-none-any wheels to serve and install next to ember")
    ap.add_argument("--no-precompile", action="store_true",
                    help="do not serve ember's modules precompiled by Pyodide (needs node)")
    ap.add_argument("--no-snapshot", action="store_true",
                    help="do not serve a prebuilt memory snapshot for first visits (needs Playwright "
                         "and Chromium)")
    a = ap.parse_args(argv)
    out = build_site(a.wheel, a.out, pyodide_dir=a.pyodide, demos_dir=a.demos,
                     extra_wheels_dir=a.extra_wheels, precompile=not a.no_precompile,
                     snapshot=not a.no_snapshot)
    n = sum(len(fs) for _, _, fs in os.walk(out))
    print(f"[site] {out} ({n} files)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
