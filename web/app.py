"""The Starlette app that serves an ember site (see ember.web.site for the layout).

One handler for every path; it does what a static server for Pyodide + WebGPU pages needs:

- MIME types the browser insists on (``.wasm`` must be ``application/wasm`` for streaming
  compilation, ``.mjs``/``.js`` ``text/javascript`` for module scripts);
- cross-origin isolation (COOP/COEP, CORP on every resource): SharedArrayBuffer and precise
  timers need it, and ``require-corp`` keeps the page from pulling anything off-site;
- ``Range`` requests (206 / 416), ``gzip`` for compressible files when no range is asked --
  the ``<file>.gz`` the site builder wrote next to a big file (streamed from disk), else, for
  files up to ``GZIP_DYNAMIC_MAX_BYTES``, compressed once per ETag into a bounded in-memory
  cache (concurrent requests for one file wait for one compression); bigger files without a
  ``.gz`` go out as they are -- ``ETag``/``Last-Modified`` with 304s, long caching for versioned URLs (/pyodide/, anything
  asked with a ``?v=<hash>`` query, as ember.js asks for the wheel), ``no-cache`` (revalidate
  every time) for the rest;
- no way out of the site folder: ``..`` segments (also ``%2e%2e``), backslashes, NUL bytes,
  dot-files and symlinks that resolve outside the folder all give 404; a redirect's Location is
  always one absolute path (``//x`` never becomes ``//x/``, which a browser reads as a host);
- bounded memory under load: every body is streamed in ``CHUNK``-sized pieces, so a slow
  client holds at most one chunk plus the transport's buffer.

>>> from starlette.testclient import TestClient  # doctest: +SKIP
>>> TestClient(create_app("site")).get("/").status_code  # doctest: +SKIP
200
"""
from __future__ import annotations

import email.utils
import gzip
import hashlib
import os
import threading
from collections import OrderedDict
from pathlib import Path
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from .site import COMPRESSIBLE, ISOLATION  # one list each for the builder and this server

MIME = {
    ".html": "text/html; charset=utf-8", ".htm": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8", ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8", ".json": "application/json", ".map": "application/json",
    ".wasm": "application/wasm", ".whl": "application/zip", ".zip": "application/zip",
    ".safetensors": "application/octet-stream", ".bin": "application/octet-stream",
    ".onnx": "application/octet-stream", ".pt": "application/octet-stream",
    ".gz": "application/gzip", ".py": "text/x-python; charset=utf-8",
    ".wgsl": "text/wgsl; charset=utf-8", ".txt": "text/plain; charset=utf-8",
    ".md": "text/markdown; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png",
    ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".ico": "image/x-icon", ".webp": "image/webp",
}
GZIP_MIN_BYTES = 1024
# Files up to this size are compressed on demand (once per ETag, in a worker thread); bigger
# ones are served compressed only from the .gz the site builder wrote (ember.web.site), so no
# request ever compresses a big file and no body bigger than this is held in memory.
GZIP_DYNAMIC_MAX_BYTES = 4 << 20
GZIP_CACHE_BYTES = 32 << 20   # compressed bodies kept in memory, least recently used first out
CHUNK = 1 << 18
# Versioned URLs may be kept by browsers without asking again: /pyodide/ holds one pinned npm
# release (build.py's PYODIDE_VERSION), and a "?v=<hash>" query (ember.js asks for the wheel
# with the manifest's sha256) names one exact content. Everything else -- including the wheel
# under its plain name, which a rebuild of the same version overwrites -- is revalidated.
LONG_CACHE_PREFIXES = ("pyodide/",)
LONG_CACHE = "public, max-age=31536000, immutable"



class _GzipCache:
    """Compressed bodies keyed by (path, size, mtime), i.e. once per ETag; least recently used
    out past the byte budget (a body over the budget is never kept). While one thread compresses
    a file, other requests for it wait for that result instead of compressing it again."""

    def __init__(self, budget: int = GZIP_CACHE_BYTES):
        self.budget, self.used = budget, 0
        self.items: OrderedDict = OrderedDict()
        self.lock = threading.Lock()
        self.pending: dict = {}
        self.compressions = 0   # how many times a file was compressed (tests, load test)

    def get(self, path: Path, st: os.stat_result) -> bytes:
        key = (str(path), st.st_size, st.st_mtime_ns)
        with self.lock:
            hit = self.items.get(key)
            if hit is not None:
                self.items.move_to_end(key)
                return hit
            flight = self.pending.get(key)
            leader = flight is None
            if leader:
                flight = self.pending[key] = threading.Lock()
                flight.acquire()
        if not leader:
            with flight:    # the leader releases it once the body is cached
                pass
            with self.lock:
                hit = self.items.get(key)
            if hit is not None:
                return hit
            return self._compress(path)   # not cached (over the budget): rare, small files only
        try:
            body = self._compress(path)
            with self.lock:
                if len(body) <= self.budget:
                    self.items[key] = body
                    self.used += len(body)
                    while self.used > self.budget:
                        _, old = self.items.popitem(last=False)
                        self.used -= len(old)
        finally:
            with self.lock:
                del self.pending[key]
            flight.release()
        return body

    def _compress(self, path: Path) -> bytes:
        self.compressions += 1
        # mtime=0: the same file always compresses to the same bytes.
        return gzip.compress(path.read_bytes(), compresslevel=6, mtime=0)


def _precompressed(path: Path, st: os.stat_result):
    """The ``<file>.gz`` the site builder wrote for ``path`` (same mtime: written from this very
    content) and its stat, or None."""
    gz = path.with_name(path.name + ".gz")
    try:
        gst = gz.stat()
    except OSError:
        return None
    return (gz, gst) if gst.st_mtime_ns == st.st_mtime_ns and gst.st_size > 0 else None


class _ChunkedResponse(Response):
    """A body already in memory (a cached gzip body), sent ``CHUNK`` bytes at a time: the
    server waits for each piece to drain before the next, so a slow client never makes the
    transport copy the whole body into its buffer (200 of them would hold 200 copies)."""

    def __init__(self, body: bytes, headers: dict):
        self.payload = body
        super().__init__(b"", headers=headers)

    async def __call__(self, scope, receive, send):
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        view = memoryview(self.payload)
        for i in range(0, len(view), CHUNK):
            await send({"type": "http.response.body", "body": bytes(view[i:i + CHUNK]), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _resolve(root: Path, url_path: str) -> Path | None:
    """The file under `root` that `url_path` names, or None (missing or not allowed)."""
    if "\x00" in url_path or "\\" in url_path:
        return None
    parts = [p for p in url_path.split("/") if p]
    # No "..", no dot-files/dot-dirs (".", "..", ".git", ".siteignore").
    if any(p.startswith(".") for p in parts):
        return None
    target = root.joinpath(*parts)
    try:
        real = target.resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    if real != root and root not in real.parents:   # a symlink pointing out of the site
        return None
    if real.is_dir():
        real = real / "index.html"
        if not real.is_file():
            return None
    return real if real.is_file() else None


def _parse_range(header: str, size: int):
    """(start, end) inclusive for a single `bytes=` range; None to ignore the header (bad
    syntax, several ranges: RFC 9110 lets a server send the whole file); "unsatisfiable"."""
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, sep, last = spec.strip().partition("-")
    if not sep:
        return None
    try:
        if first == "":              # bytes=-N: the last N bytes
            n = int(last)
            if n <= 0:
                return "unsatisfiable"
            return (max(0, size - n), size - 1) if size else "unsatisfiable"
        start = int(first)
        end = int(last) if last else size - 1
    except ValueError:
        return None
    if start < 0 or (last and end < start):
        return None
    if start >= size:
        return "unsatisfiable"
    return start, min(end, size - 1)


def _file_chunks(path: Path, start: int, length: int):
    with open(path, "rb") as f:
        f.seek(start)
        while length > 0:
            data = f.read(min(CHUNK, length))
            if not data:
                break
            length -= len(data)
            yield data


def create_app(site_dir: str | os.PathLike) -> Starlette:
    """The ASGI app serving the files of `site_dir` (GET and HEAD)."""
    root = Path(site_dir).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"ember.web: site folder {root} does not exist; build it with "
                                "'python build.py site'")
    gz_cache = _GzipCache()

    def not_found(reason: str = "Not found") -> Response:
        return Response(reason + "\n", status_code=404, media_type="text/plain", headers=ISOLATION)

    async def serve(request: Request) -> Response:
        url_path = request.scope["path"]     # already %-decoded: "%2e%2e" arrives as ".."
        path = _resolve(root, url_path)
        if path is None:
            return not_found()
        if not url_path.endswith("/") and path.name == "index.html" and not url_path.endswith(".html"):
            # /demos/x -> /demos/x/ so relative links in the page resolve inside its folder. The
            # target is rebuilt from the path's segments: "//demos/x" must not become
            # "//demos/x/", which a browser reads as the host "demos".
            location = "/" + "/".join(quote(p) for p in url_path.split("/") if p) + "/"
            query = request.scope.get("query_string", b"").decode("latin-1")
            if query:
                location += "?" + quote(query, safe="=&;%+,/:@!$'()*~")
            return Response(status_code=308, headers={**ISOLATION, "Location": location})
        st = path.stat()
        ext = path.suffix.lower()
        rel = path.relative_to(root).as_posix()
        etag = '"%s"' % hashlib.sha1(f"{rel}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:20]
        range_header = request.headers.get("range")
        if range_header and request.headers.get("if-range") not in (None, etag):
            range_header = None     # the client's partial copy is stale: send it all
        use_gzip = (ext in COMPRESSIBLE and st.st_size >= GZIP_MIN_BYTES and not range_header
                    and "gzip" in request.headers.get("accept-encoding", "").lower())
        pre = _precompressed(path, st) if use_gzip else None
        if use_gzip and pre is None and st.st_size > GZIP_DYNAMIC_MAX_BYTES:
            use_gzip = False    # too big to compress per request, and no .gz from the builder
        if use_gzip:
            etag = etag[:-1] + '-gz"'
        headers = {
            **ISOLATION,
            "Content-Type": MIME.get(ext, "application/octet-stream"),
            "ETag": etag,
            "Last-Modified": email.utils.formatdate(st.st_mtime, usegmt=True),
            "Accept-Ranges": "bytes",
            "Cache-Control": (LONG_CACHE if rel.startswith(LONG_CACHE_PREFIXES) or "v" in request.query_params
                              else "no-cache"),
        }
        if ext in COMPRESSIBLE:
            headers["Vary"] = "Accept-Encoding"

        inm = request.headers.get("if-none-match")
        if inm is not None:
            tags = {t.strip().removeprefix("W/") for t in inm.split(",")}
            if etag in tags or "*" in tags:
                return Response(status_code=304, headers={k: v for k, v in headers.items()
                                                          if k != "Content-Type"})
        elif request.headers.get("if-modified-since"):
            try:
                since = email.utils.parsedate_to_datetime(request.headers["if-modified-since"])
                if int(st.st_mtime) <= since.timestamp():
                    return Response(status_code=304, headers={k: v for k, v in headers.items()
                                                              if k != "Content-Type"})
            except (TypeError, ValueError):
                pass    # unparseable date: ignore the header, as RFC 9110 says

        head = request.method == "HEAD"
        if range_header:
            rng = _parse_range(range_header, st.st_size)
            if rng == "unsatisfiable":
                return Response(status_code=416, headers={
                    **ISOLATION, "Content-Range": f"bytes */{st.st_size}",
                    "Content-Type": "text/plain"})
            if rng is not None:
                start, end = rng
                headers["Content-Range"] = f"bytes {start}-{end}/{st.st_size}"
                headers["Content-Length"] = str(end - start + 1)
                if head:
                    return Response(status_code=206, headers=headers)
                return StreamingResponse(_file_chunks(path, start, end - start + 1),
                                         status_code=206, headers=headers)
        if use_gzip:
            headers["Content-Encoding"] = "gzip"
            # Content-Length now counts compressed bytes while fetch() hands out decoded ones:
            # progress bars (ember.js fetchBytes, ember.wasm.fetch_bytes) need the real size.
            headers["X-Uncompressed-Length"] = str(st.st_size)
            if pre is not None:
                gz, gst = pre
                headers["Content-Length"] = str(gst.st_size)
                if head:
                    return Response(status_code=200, headers=headers)
                return StreamingResponse(_file_chunks(gz, 0, gst.st_size), headers=headers)
            # Compressing takes a while for a few MB: not on the event loop.
            body = await run_in_threadpool(gz_cache.get, path, st)
            headers["Content-Length"] = str(len(body))
            if head:
                return Response(status_code=200, headers=headers)
            return _ChunkedResponse(body, headers)
        headers["Content-Length"] = str(st.st_size)
        if head:
            return Response(status_code=200, headers=headers)
        return StreamingResponse(_file_chunks(path, 0, st.st_size), headers=headers)

    app = Starlette(routes=[Route("/{path:path}", serve, methods=["GET", "HEAD"])])
    app.state.gzip_cache = gz_cache
    return app
