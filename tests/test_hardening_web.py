"""ember.web under load and against slow or odd clients (issue 12): gzip once per file (at site
build time, or once per ETag in a bounded cache), no gzip of big files per request, an absolute
redirect Location, header / keep-alive timeouts, and a loopback load test of 200 concurrent
clients that checks every response and the server's peak memory.

Run as a script for the full-size load test on a built site::

    .venv/bin/python tests/test_hardening_web.py --site site --clients 200 --rounds 2
"""
from __future__ import annotations

import asyncio
import gzip
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from ember.web import app as web_app  # noqa: E402
from ember.web.app import create_app  # noqa: E402
from ember.web.site import build_site  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def asgi_get(app, path: str, headers=(), query=b""):
    """One request straight through the ASGI app with an exact path (no client normalising
    "//"). Returns (status, headers dict, body)."""
    scope = {"type": "http", "http_version": "1.1", "method": "GET", "scheme": "http", "path": path,
             "raw_path": path.encode(), "query_string": query, "root_path": "",
             "headers": [(k.encode(), v.encode()) for k, v in headers],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    sent = []

    async def receive():
        await asyncio.sleep(3600)   # a client that never disconnects

    async def send(msg):
        sent.append(msg)

    async def run():
        await asyncio.wait_for(app(scope, receive, send), 30)

    asyncio.run(run())
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode().lower(): v.decode() for k, v in start["headers"]}, body


def noise(n: int, seed: int = 0) -> bytes:
    """float16-like bytes: compress a little, like real weights."""
    rng = random.Random(seed)
    return bytes(rng.getrandbits(8) if i % 2 == 0 else rng.choice((0x3C, 0x3B, 0xBC, 0x38)) for i in range(n))


@pytest.fixture
def site(tmp_path):
    root = tmp_path / "site"
    (root / "demos" / "mnist").mkdir(parents=True)
    (root / "pyodide").mkdir()
    (root / "index.html").write_text("<!doctype html><title>t</title>" + "<p>x</p>" * 400)
    (root / "demos" / "mnist" / "index.html").write_text("<p>mnist</p>" * 300)
    (root / "demos" / "mnist" / "model.py").write_text("import ember\n" * 300)
    (root / "pyodide" / "pyodide.asm.wasm").write_bytes(b"\x00asm" + bytes(i % 251 for i in range(2_000_000)))
    return root


# ---- redirects ----------------------------------------------------------------------------------

@pytest.mark.parametrize("path,location", [
    ("/demos/mnist", "/demos/mnist/"), ("//demos/mnist", "/demos/mnist/"), ("///demos//mnist", "/demos/mnist/"),
    ("/demos/./mnist", None),
])
def test_redirect_location_is_one_absolute_path(site, path, location):
    status, headers, _ = asgi_get(create_app(site), path)
    if location is None:
        assert status == 404
        return
    assert status == 308 and headers["location"] == location
    assert not headers["location"].startswith("//")


def test_redirect_keeps_the_query(site):
    status, headers, _ = asgi_get(create_app(site), "//demos/mnist", query=b"backend=cpu&x=1")
    assert status == 308 and headers["location"] == "/demos/mnist/?backend=cpu&x=1"


# ---- gzip: once per file ------------------------------------------------------------------------

def test_dynamic_gzip_compresses_once_per_etag_even_when_concurrent(site):
    app = create_app(site)
    cache = app.state.gzip_cache
    path = site / "pyodide" / "pyodide.asm.wasm"
    st = path.stat()
    barrier = threading.Barrier(16)
    bodies = []

    def worker():
        barrier.wait()
        bodies.append(cache.get(path, st))

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.compressions == 1 and len({id(b) for b in bodies}) == 1
    assert gzip.decompress(bodies[0]) == path.read_bytes()
    for _ in range(5):
        status, headers, body = asgi_get(app, "/pyodide/pyodide.asm.wasm", [("accept-encoding", "gzip")])
        assert status == 200 and headers["content-encoding"] == "gzip" and gzip.decompress(body) == path.read_bytes()
    assert cache.compressions == 1


def test_gzip_cache_is_bounded_and_never_keeps_an_item_over_budget(tmp_path):
    root = tmp_path / "s"
    root.mkdir()
    for i in range(12):
        (root / f"f{i}.js").write_bytes(noise(200_000, i))
    cache = web_app._GzipCache(budget=600_000)
    for i in range(12):
        p = root / f"f{i}.js"
        cache.get(p, p.stat())
        assert cache.used <= cache.budget
    assert 1 <= len(cache.items) < 12
    tiny = web_app._GzipCache(budget=10)
    p = root / "f0.js"
    assert gzip.decompress(tiny.get(p, p.stat())) == p.read_bytes()
    assert tiny.used == 0 and not tiny.items


def test_big_file_is_not_compressed_per_request(site, monkeypatch):
    monkeypatch.setattr(web_app, "GZIP_DYNAMIC_MAX_BYTES", 1 << 20)
    app = create_app(site)
    status, headers, body = asgi_get(app, "/pyodide/pyodide.asm.wasm", [("accept-encoding", "gzip")])
    assert status == 200 and "content-encoding" not in headers
    assert body == (site / "pyodide" / "pyodide.asm.wasm").read_bytes()
    assert app.state.gzip_cache.compressions == 0


@pytest.fixture
def sources(tmp_path):
    pyo = tmp_path / "pyodide"
    pyo.mkdir()
    for name in ("pyodide.mjs", "pyodide.asm.mjs", "python_stdlib.zip"):
        (pyo / name).write_text(name)
    (pyo / "pyodide-lock.json").write_text(json.dumps({"info": {"python": "3.14.2"}, "packages": {}}))
    (pyo / "pyodide.asm.wasm").write_bytes(b"\x00asm" + bytes(i % 251 for i in range(3_000_000)))
    (pyo / "package.json").write_text(json.dumps({"name": "pyodide", "version": "314.0.7"}))
    whl = tmp_path / "ember-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("ember/__init__.py", "")
    demos = tmp_path / "demos"
    (demos / "w").mkdir(parents=True)
    (demos / "w" / "index.html").write_text("<title>w</title>")
    (demos / "w" / "w.safetensors").write_bytes(noise(600_000))
    (demos / "w" / "random.bin").write_bytes(os.urandom(400_000))   # does not compress: no .gz
    return pyo, whl, demos


def test_site_build_precompresses_big_files_once(tmp_path, sources, monkeypatch):
    pyo, whl, demos = sources
    out = build_site(whl, tmp_path / "out", pyodide_dir=pyo, demos_dir=demos)
    wasm, gz = out / "pyodide" / "pyodide.asm.wasm", out / "pyodide" / "pyodide.asm.wasm.gz"
    assert gzip.decompress(gz.read_bytes()) == wasm.read_bytes()
    assert gz.stat().st_mtime_ns == wasm.stat().st_mtime_ns
    assert (out / "demos" / "w" / "w.safetensors.gz").is_file()
    assert not (out / "demos" / "w" / "random.bin.gz").exists()
    assert not (out / "pyodide" / "package.json.gz").exists()        # small: compressed on demand
    assert not any(p.name.endswith(".tmp") for p in out.rglob("*"))
    # a rebuild leaves the .gz alone; a changed file gets a new one
    before = gz.stat().st_ino, gz.stat().st_mtime_ns
    build_site(whl, out, pyodide_dir=pyo, demos_dir=demos)
    assert (gz.stat().st_ino, gz.stat().st_mtime_ns) == before
    (pyo / "pyodide.asm.wasm").write_bytes(b"\x00asm" + bytes(i % 7 for i in range(2_000_000)))
    build_site(whl, out, pyodide_dir=pyo, demos_dir=demos)
    assert gzip.decompress(gz.read_bytes()) == wasm.read_bytes()

    # the server streams the .gz from disk and compresses nothing itself, whatever the size
    monkeypatch.setattr(web_app, "GZIP_DYNAMIC_MAX_BYTES", 1)
    app = create_app(out)
    for url, f in (("/pyodide/pyodide.asm.wasm", wasm), ("/demos/w/w.safetensors", out / "demos/w/w.safetensors")):
        status, headers, body = asgi_get(app, url, [("accept-encoding", "gzip")])
        assert status == 200 and headers["content-encoding"] == "gzip", url
        assert headers["content-length"] == str(len(body)) and headers["x-uncompressed-length"] == str(f.stat().st_size)
        assert gzip.decompress(body) == f.read_bytes()
    assert app.state.gzip_cache.compressions == 0
    # a stale .gz (the file changed after the build) is ignored
    os.utime(wasm, ns=(wasm.stat().st_atime_ns, wasm.stat().st_mtime_ns + 10 ** 9))
    status, headers, body = asgi_get(app, "/pyodide/pyodide.asm.wasm", [("accept-encoding", "gzip")])
    assert "content-encoding" not in headers and body == wasm.read_bytes()


# ---- a real server: timeouts and load -----------------------------------------------------------

class Server:
    def __init__(self, site, *args):
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "ember.web", "--site", str(site), "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                     cwd=REPO)
        line = self.proc.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert m, line
        self.port = int(m.group(1))

    def status(self, field: str) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for ln in f:
                if ln.startswith(field + ":"):
                    return int(ln.split()[1]) * 1024
        raise KeyError(field)

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def wait_closed(sock, limit: float) -> float:
    """Seconds until the server closes ``sock`` (reads until EOF), or ``limit`` + 1."""
    t0 = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - t0 < limit:
        try:
            data = sock.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            return time.monotonic() - t0
        if data == b"":
            return time.monotonic() - t0
    return limit + 1


needs_proc = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")


@needs_proc
def test_silent_and_slow_clients_are_timed_out(site):
    srv = Server(site, "--header-timeout", "1", "--keep-alive", "1")
    try:
        silent = socket.create_connection(("127.0.0.1", srv.port))
        slow = socket.create_connection(("127.0.0.1", srv.port))
        slow.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")       # never finishes its headers
        assert wait_closed(silent, 5) < 4
        assert wait_closed(slow, 5) < 4
        # a kept-alive connection: served, then closed once idle
        kept = socket.create_connection(("127.0.0.1", srv.port))
        kept.sendall(b"GET /demos/mnist/model.py HTTP/1.1\r\nHost: x\r\n\r\n")
        kept.settimeout(5)
        assert kept.recv(65536).startswith(b"HTTP/1.1 200")
        assert wait_closed(kept, 5) < 4
        # and a normal client still gets its page
        c = socket.create_connection(("127.0.0.1", srv.port))
        c.sendall(b"GET /demos/mnist/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        c.settimeout(5)
        assert c.recv(65536).startswith(b"HTTP/1.1 200")
    finally:
        srv.close()


async def _fetch(port: int, path: str, gz: bool, deadline: float):
    """GET ``path`` on a new connection; returns (status, body bytes read, Content-Length)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), deadline)
    try:
        enc = "gzip" if gz else "identity"
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept-Encoding: {enc}\r\n"
                     f"Connection: close\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), deadline)
        status = int(head.split(b" ", 2)[1])
        m = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
        length = int(m.group(1)) if m else None
        got = 0
        while True:
            chunk = await asyncio.wait_for(reader.read(1 << 18), deadline)
            if not chunk:
                break
            got += len(chunk)
        return status, got, length
    finally:
        writer.close()


def load_test(site: Path, clients: int, rounds: int, paths: list, *, server_args=()) -> dict:
    """``clients`` concurrent clients, each fetching every path ``rounds`` times (half asking
    for gzip) from a fresh server on loopback; every response must be 200 with all its bytes.
    Returns the figures: requests, bytes, seconds, server peak RSS (VmHWM)."""
    srv = Server(site, "--max-connections", str(max(512, 2 * clients)), *server_args)
    try:
        base_rss = srv.status("VmRSS")
        peak_sampled = [base_rss]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                try:
                    peak_sampled.append(srv.status("VmRSS"))
                except (OSError, KeyError):
                    pass
                stop.wait(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        failures = []
        total = [0, 0]

        async def client(i):
            rng = random.Random(i)
            for r in range(rounds):
                order = list(paths)
                rng.shuffle(order)
                for p in order:
                    try:
                        status, got, length = await _fetch(srv.port, p, gz=(i + r) % 2 == 0, deadline=120)
                    except Exception as e:  # noqa: BLE001 - every failure is reported
                        failures.append((p, repr(e)))
                        continue
                    total[0] += 1
                    total[1] += got
                    if status != 200 or length is None or got != length:
                        failures.append((p, status, got, length))

        async def main():
            await asyncio.gather(*(client(i) for i in range(clients)))

        t0 = time.perf_counter()
        asyncio.run(main())
        seconds = time.perf_counter() - t0
        stop.set()
        sampler.join()
        return {"clients": clients, "requests": total[0], "bytes": total[1], "seconds": round(seconds, 1),
                "failures": failures[:10], "n_failures": len(failures), "rss_start": base_rss,
                "rss_peak_sampled": max(peak_sampled), "rss_hwm": srv.status("VmHWM")}
    finally:
        srv.close()


LOAD_RSS_BOUND = 300 << 20   # the server's peak resident memory under the load below


@needs_proc
def test_200_concurrent_clients_all_complete_and_memory_stays_bounded(tmp_path):
    # a site like the real one, smaller: weights 6 MB (over the dynamic-gzip limit, no .gz:
    # served as they are), a 3 MB wasm and pages (gzipped on demand, once each), a .gz'd model
    site = tmp_path / "site"
    (site / "demos" / "minilm").mkdir(parents=True)
    (site / "pyodide").mkdir()
    (site / "index.html").write_text("<!doctype html><title>ember</title>" + "<li>demo</li>" * 300)
    (site / "demos" / "minilm" / "index.html").write_text("<p>minilm</p>" * 500)
    (site / "demos" / "minilm" / "model.py").write_text("import ember\n" * 2000)
    (site / "demos" / "minilm" / "w.safetensors").write_bytes(noise(6 << 20, 1))
    (site / "pyodide" / "pyodide.asm.wasm").write_bytes(b"\x00asm" + bytes(i % 251 for i in range(3 << 20)))
    paths = ["/", "/demos/minilm/", "/demos/minilm/model.py", "/demos/minilm/w.safetensors",
             "/pyodide/pyodide.asm.wasm"]
    res = load_test(site, clients=200, rounds=1, paths=paths)
    print("load test:", res)
    assert res["n_failures"] == 0, res["failures"]
    assert res["requests"] == 200 * len(paths)
    assert res["rss_hwm"] < LOAD_RSS_BOUND, res


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="load test an ember site on loopback")
    ap.add_argument("--site", default=str(REPO / "site"))
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    root = Path(a.site)
    big = sorted((p for p in root.rglob("*") if p.is_file() and not p.name.endswith(".gz")),
                 key=lambda p: p.stat().st_size, reverse=True)
    paths = ["/", "/demos/mnist/", "/demos/minilm/"] + ["/" + p.relative_to(root).as_posix() for p in big[:4]]
    print("paths:", paths)
    print(json.dumps(load_test(root, a.clients, a.rounds, paths), indent=1))
