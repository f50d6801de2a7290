"""ember.web: the site builder and the Starlette app (MIME types, isolation headers, ranges,
gzip, caching, path traversal, loopback default, port-taken message)."""
from __future__ import annotations

import asyncio
import gzip
import json
import os
import re
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

import warnings  # noqa: E402

with warnings.catch_warnings():  # newer Starlette suggests httpx2; httpx works the same here
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient  # noqa: E402

from ember.web.__main__ import bind, parse_args  # noqa: E402
from ember.web.app import create_app  # noqa: E402
from ember.web.site import build_site, favicon  # noqa: E402

# Bytes that gzip well but are not trivially constant (a repeating ramp).
WASM = b"\x00asm\x01\x00\x00\x00" + bytes(i % 251 for i in range(60_000))


@pytest.fixture
def site(tmp_path):
    """A small site folder, plus a secret file outside it and a symlink pointing at it."""
    root = tmp_path / "site"
    (root / "pyodide").mkdir(parents=True)
    (root / "wheels").mkdir()
    (root / "demos" / "d").mkdir(parents=True)
    (root / "index.html").write_text("<!doctype html><title>t</title>" + "x" * 2000)
    (root / "pyodide" / "pyodide.asm.wasm").write_bytes(WASM)
    (root / "pyodide" / "pyodide.mjs").write_text("export const a = 1;\n" * 100)
    (root / "pyodide" / "pyodide-lock.json").write_text(json.dumps({"k": list(range(500))}))
    (root / "wheels" / "ember-0.1.0-py3-none-any.whl").write_bytes(b"PK\x03\x04" + b"w" * 100)
    (root / "demos" / "d" / "index.html").write_text("<p>demo</p>")
    (root / "demos" / "d" / "app.js").write_text("console.log(1);\n")
    (root / "demos" / "d" / "w.safetensors").write_bytes(bytes(range(256)) * 40)
    (root / "demos" / "d" / "data.zip").write_bytes(b"PK\x05\x06" + b"\x00" * 18)
    (root / "demos" / "d" / "model.py").write_text("x = 1\n")
    (root / ".hidden").write_text("no")
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET")
    (root / "leak.txt").symlink_to(secret)
    (root / "leakdir").symlink_to(tmp_path)
    (root / "inside.txt").symlink_to(root / "demos" / "d" / "model.py")
    return root


@pytest.fixture
def client(site):
    return TestClient(create_app(site))


def raw_get(app, raw_path: bytes, headers=()):
    """Send a request with an exact, unnormalised path (httpx would clean up "/../")."""
    from urllib.parse import unquote_to_bytes

    scope = {"type": "http", "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": unquote_to_bytes(raw_path).decode("utf-8", "replace"), "raw_path": raw_path,
             "query_string": b"", "root_path": "", "headers": list(headers),
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(msg):
        sent.append(msg)

    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], body


# ---- MIME types and isolation headers --------------------------------------------------------

@pytest.mark.parametrize("path,mime", [
    ("/", "text/html"),
    ("/index.html", "text/html"),
    ("/pyodide/pyodide.asm.wasm", "application/wasm"),
    ("/pyodide/pyodide.mjs", "text/javascript"),
    ("/demos/d/app.js", "text/javascript"),
    ("/pyodide/pyodide-lock.json", "application/json"),
    ("/demos/d/w.safetensors", "application/octet-stream"),
    ("/wheels/ember-0.1.0-py3-none-any.whl", "application/zip"),
    ("/demos/d/data.zip", "application/zip"),
])
def test_mime_types_and_isolation_headers(client, path, mime):
    r = client.get(path)
    assert r.status_code == 200
    assert r.headers["content-type"].split(";")[0] == mime
    assert r.headers["cross-origin-opener-policy"] == "same-origin"
    assert r.headers["cross-origin-embedder-policy"] == "require-corp"
    assert r.headers["cross-origin-resource-policy"] == "same-origin"
    assert r.headers["x-content-type-options"] == "nosniff"


def test_body_is_the_file(client, site):
    r = client.get("/pyodide/pyodide.asm.wasm", headers={"Accept-Encoding": "identity"})
    assert r.content == WASM
    assert "content-encoding" not in r.headers
    assert r.headers["content-length"] == str(len(WASM))


def test_head_has_headers_and_no_body(client):
    r = client.head("/pyodide/pyodide.asm.wasm", headers={"Accept-Encoding": "identity"})
    assert r.status_code == 200 and r.content == b""
    assert r.headers["content-length"] == str(len(WASM))


def test_post_is_not_allowed(client):
    assert client.post("/index.html").status_code == 405


def test_directory_without_slash_redirects(client):
    r = client.get("/demos/d", follow_redirects=False)
    assert r.status_code == 308 and r.headers["location"] == "/demos/d/"
    assert client.get("/demos/d/").text == "<p>demo</p>"


# ---- range requests ---------------------------------------------------------------------------

@pytest.mark.parametrize("spec,start,end", [("bytes=0-99", 0, 99), ("bytes=100-", 100, len(WASM) - 1),
                                            ("bytes=-10", len(WASM) - 10, len(WASM) - 1),
                                            ("bytes=59000-999999", 59000, len(WASM) - 1)])
def test_range_gives_206(client, spec, start, end):
    r = client.get("/pyodide/pyodide.asm.wasm", headers={"Range": spec, "Accept-Encoding": "gzip"})
    assert r.status_code == 206
    assert r.headers["content-range"] == f"bytes {start}-{end}/{len(WASM)}"
    assert r.content == WASM[start:end + 1]
    assert "content-encoding" not in r.headers  # never gzip a range


@pytest.mark.parametrize("spec", ["bytes=70000-", f"bytes={len(WASM)}-{len(WASM) + 5}", "bytes=-0"])
def test_unsatisfiable_range_gives_416(client, spec):
    r = client.get("/pyodide/pyodide.asm.wasm", headers={"Range": spec})
    assert r.status_code == 416
    assert r.headers["content-range"] == f"bytes */{len(WASM)}"


@pytest.mark.parametrize("spec", ["bytes=5-2", "items=0-5", "bytes=abc", "bytes=0-1,4-5"])
def test_malformed_or_multi_range_is_ignored(client, spec):
    # RFC 9110 lets a server ignore a Range it does not handle: the whole file, 200.
    r = client.get("/pyodide/pyodide.asm.wasm", headers={"Range": spec, "Accept-Encoding": "identity"})
    assert r.status_code == 200 and r.content == WASM


def test_if_range_with_stale_etag_sends_everything(client):
    r = client.get("/pyodide/pyodide.asm.wasm",
                   headers={"Range": "bytes=0-9", "If-Range": '"stale"', "Accept-Encoding": "identity"})
    assert r.status_code == 200 and r.content == WASM
    etag = r.headers["etag"]
    r = client.get("/pyodide/pyodide.asm.wasm", headers={"Range": "bytes=0-9", "If-Range": etag})
    assert r.status_code == 206 and r.content == WASM[:10]


# ---- compression ------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/pyodide/pyodide.asm.wasm", "/pyodide/pyodide.mjs",
                                  "/demos/d/w.safetensors", "/index.html"])
def test_gzip_when_accepted(client, site, path):
    r = client.get(path, headers={"Accept-Encoding": "gzip, deflate"})
    assert r.headers["content-encoding"] == "gzip"
    assert "Accept-Encoding" in r.headers["vary"]
    on_disk = (site / path.lstrip("/")).read_bytes() if path != "/" else b""
    assert r.content == on_disk  # httpx decodes; the bytes must round-trip
    assert int(r.headers["content-length"]) < len(on_disk)
    assert r.headers["x-uncompressed-length"] == str(len(on_disk))


def test_gzip_body_is_valid_gzip(site):
    # Look at the encoded bytes themselves (no client-side decoding).
    status, body = raw_get(create_app(site), b"/pyodide/pyodide.asm.wasm",
                           headers=[(b"accept-encoding", b"gzip")])
    assert status == 200 and gzip.decompress(body) == WASM


def test_no_gzip_for_small_or_zipped_files_or_when_not_accepted(client):
    assert "content-encoding" not in client.get("/demos/d/model.py", headers={"Accept-Encoding": "gzip"}).headers
    assert "content-encoding" not in client.get("/wheels/ember-0.1.0-py3-none-any.whl",
                                                headers={"Accept-Encoding": "gzip"}).headers
    assert "content-encoding" not in client.get("/pyodide/pyodide.asm.wasm",
                                                headers={"Accept-Encoding": "identity"}).headers


# ---- caching ----------------------------------------------------------------------------------

def test_etag_and_304(client):
    r = client.get("/pyodide/pyodide.mjs", headers={"Accept-Encoding": "identity"})
    etag = r.headers["etag"]
    assert r.headers["last-modified"]
    r2 = client.get("/pyodide/pyodide.mjs", headers={"If-None-Match": etag, "Accept-Encoding": "identity"})
    assert r2.status_code == 304 and r2.content == b""
    assert r2.headers["etag"] == etag
    r3 = client.get("/pyodide/pyodide.mjs", headers={"If-None-Match": '"other"', "Accept-Encoding": "identity"})
    assert r3.status_code == 200
    # the gzip variant is a different representation: its own tag
    gz = client.get("/pyodide/pyodide.mjs", headers={"Accept-Encoding": "gzip"}).headers["etag"]
    assert gz != etag
    r4 = client.get("/pyodide/pyodide.mjs", headers={"If-Modified-Since": r.headers["last-modified"]})
    assert r4.status_code == 304


def test_etag_changes_when_the_file_changes(client, site):
    before = client.get("/demos/d/model.py").headers["etag"]
    p = site / "demos" / "d" / "model.py"
    p.write_text("x = 2  # changed\n")
    os.utime(p, ns=(p.stat().st_atime_ns, p.stat().st_mtime_ns + 5_000_000_000))
    r = client.get("/demos/d/model.py", headers={"If-None-Match": before})
    assert r.status_code == 200 and r.headers["etag"] != before and "changed" in r.text


def test_cache_control(client):
    assert client.get("/").headers["cache-control"] == "no-cache"
    assert client.get("/demos/d/app.js").headers["cache-control"] == "no-cache"
    # a rebuilt wheel keeps its name: revalidate, unless asked for one exact content (?v=hash)
    assert client.get("/wheels/ember-0.1.0-py3-none-any.whl").headers["cache-control"] == "no-cache"
    for path in ("/wheels/ember-0.1.0-py3-none-any.whl?v=0123abcd", "/pyodide/pyodide.asm.wasm"):
        cc = client.get(path).headers["cache-control"]
        assert "max-age=31536000" in cc and "immutable" in cc


# ---- no way out of the site folder ------------------------------------------------------------

@pytest.mark.parametrize("raw", [
    b"/../secret.txt", b"/demos/../../secret.txt", b"/%2e%2e/secret.txt", b"/%2E%2E/secret.txt",
    b"/demos/%2e%2e/%2e%2e/secret.txt", b"/..%2fsecret.txt", b"/%2e%2e%2fsecret.txt",
    b"//etc/passwd", b"/etc/passwd", b"/leak.txt", b"/leakdir/secret.txt", b"/.hidden",
    b"/demos/..%5c..%5csecret.txt", b"/index.html%00.txt", b"/%00",
])
def test_traversal_is_refused(site, raw):
    status, body = raw_get(create_app(site), raw)
    assert status in (400, 404), (raw, status)
    assert b"SECRET" not in body and b"root:" not in body


def test_symlink_inside_the_site_is_served(client):
    assert client.get("/inside.txt").text == "x = 1\n"


def test_missing_site_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="build.py site"):
        create_app(tmp_path / "nope")


# ---- command line -----------------------------------------------------------------------------

def test_default_host_is_loopback():
    a = parse_args(["--site", "x"])
    assert a.host == "127.0.0.1" and a.port == 8000


def test_port_taken_says_so():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        with pytest.raises(SystemExit, match=f"port {port} on 127.0.0.1 is already in use"):
            bind("127.0.0.1", port)


def test_server_process_serves_and_prints_its_url(site):
    import httpx

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "ember.web", "--site", str(site), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        line = proc.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert m, line
        r = httpx.get(m.group(0), timeout=30)
        assert r.status_code == 200 and r.headers["cross-origin-opener-policy"] == "same-origin"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# ---- site assembly ----------------------------------------------------------------------------

@pytest.fixture
def sources(tmp_path):
    """A fake npm Pyodide folder, a wheel and a demos folder."""
    pyo = tmp_path / "pyodide"
    pyo.mkdir()
    for name in ("pyodide.mjs", "pyodide.asm.mjs", "python_stdlib.zip"):
        (pyo / name).write_text(name)
    (pyo / "pyodide-lock.json").write_text(json.dumps({"info": {"python": "3.14.2"}, "packages": {}}))
    (pyo / "pyodide.asm.wasm").write_bytes(WASM)
    (pyo / "package.json").write_text(json.dumps({"name": "pyodide", "version": "314.0.7"}))
    (pyo / "README.md").write_text("docs")
    (pyo / "pyodide.d.ts").write_text("types")
    (pyo / "console.html").write_text("<p>")
    whl = tmp_path / "ember-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("ember/__init__.py", "")
    demos = tmp_path / "demos"
    d = demos / "digits"
    (d / "__pycache__").mkdir(parents=True)
    (d / "data").mkdir()
    (d / "index.html").write_text('<html><head><title>Digits &amp; more</title>'
                                  '<meta name="description" content="Draw a digit"></head></html>')
    (d / "model.py").write_text("x = 1\n")
    (d / "w.safetensors").write_bytes(b"\x08" + b"\x00" * 7 + b"{}      ")
    (d / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"pyc")
    (d / "data" / "train-images.gz").write_bytes(b"big")
    (d / ".siteignore").write_text("# training only\ndata\n*.ckpt\n")
    (d / "last.ckpt").write_bytes(b"ckpt")
    (demos / "nopage").mkdir()
    (demos / "nopage" / "util.py").write_text("")
    return pyo, whl, demos


def test_build_site_layout_and_manifest(tmp_path, sources):
    pyo, whl, demos = sources
    out = build_site(whl, tmp_path / "out", pyodide_dir=pyo, demos_dir=demos)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == sorted([
        "index.html", "favicon.ico", "manifest.json", "wasm/ember.js", "wasm/demo-kit.js", "wasm/demo.css",
        "wasm/snapshot.js", "wheels/ember-0.1.0-py3-none-any.whl",
        "pyodide/package.json", "pyodide/pyodide-lock.json", "pyodide/pyodide.asm.mjs",
        "pyodide/pyodide.asm.wasm", "pyodide/pyodide.mjs", "pyodide/python_stdlib.zip",
        "demos/digits/index.html", "demos/digits/model.py", "demos/digits/w.safetensors",
        "demos/nopage/util.py"])
    m = json.loads((out / "manifest.json").read_text())
    assert m["wheel"] == "wheels/ember-0.1.0-py3-none-any.whl"
    assert m["pyodide_version"] == "314.0.7" and m["ember_version"] == "0.1.0"
    assert m["pyodide_python"] == "3.14.2"
    import hashlib
    assert m["wheel_sha256"] == hashlib.sha256(whl.read_bytes()).hexdigest()
    assert m["demos"] == [{"name": "digits", "title": "Digits & more", "description": "Draw a digit",
                           "kind": "demo", "url": "demos/digits/"}]
    index = (out / "index.html").read_text()
    assert 'href="demos/digits/"' in index and "Digits &amp; more" in index
    assert "Python 3.14.2" in index
    assert (out / "favicon.ico").read_bytes() == favicon()


def test_build_site_serves_a_prebuilt_snapshot_only_when_one_is_made_for_it(tmp_path, sources, monkeypatch):
    """``snapshot=True``: the cached snapshot for this manifest's key (wheel, Pyodide, loader) is
    served as wheels/ember-<sha16>-snapshot.bin and recorded in the manifest; without one and
    without a browser to make it, the site is built without (pages boot as before)."""
    import hashlib

    from ember.web import site as site_mod
    pyo, whl, demos = sources
    cache = tmp_path / "snapcache"
    monkeypatch.setattr(site_mod, "SNAPSHOT_CACHE", cache)
    monkeypatch.setenv("EMBER_CHROMIUM", str(tmp_path / "no-chromium"))
    out = build_site(whl, tmp_path / "out", pyodide_dir=pyo, demos_dir=demos, snapshot=True)
    m = json.loads((out / "manifest.json").read_text())
    assert "snapshot" not in m
    body = b"EMS1 packed heap " * 64
    sha = hashlib.sha256(body).hexdigest()
    key = site_mod.snapshot_key(m)[:32]
    cache.mkdir()
    (cache / f"{key}.bin").write_bytes(body)
    record = {"meta": {"format": 2, "wheel_sha256": m["wheel_sha256"]}, "bytes": 1 << 16, "body": len(body),
              "sha256": sha}
    (cache / f"{key}.json").write_text(json.dumps(record))
    build_site(whl, out, pyodide_dir=pyo, demos_dir=demos, snapshot=True)
    m2 = json.loads((out / "manifest.json").read_text())
    rel = f"wheels/ember-{sha[:16]}-snapshot.bin"
    assert m2["snapshot"] == {"path": rel, **record}
    assert (out / rel).read_bytes() == body and m2["files"][rel] == sha[:16]
    assert {k: v for k, v in m2.items() if k not in ("snapshot", "files")} == \
        {k: v for k, v in m.items() if k != "files"}
    # another wheel: another key, so the cached one is not served (and the old file goes)
    with zipfile.ZipFile(whl, "a") as z:
        z.writestr("ember/more.py", "x = 2\n")
    build_site(whl, out, pyodide_dir=pyo, demos_dir=demos, snapshot=True)
    assert "snapshot" not in json.loads((out / "manifest.json").read_text())
    assert not (out / rel).exists()


def test_build_site_resyncs_and_keeps_unchanged_files(tmp_path, sources):
    pyo, whl, demos = sources
    out = build_site(whl, tmp_path / "out", pyodide_dir=pyo, demos_dir=demos)
    wasm_mtime = (out / "pyodide" / "pyodide.asm.wasm").stat().st_mtime_ns
    (demos / "digits" / "model.py").unlink()
    build_site(whl, out, pyodide_dir=pyo, demos_dir=demos)
    assert not (out / "demos" / "digits" / "model.py").exists()
    assert (out / "pyodide" / "pyodide.asm.wasm").stat().st_mtime_ns == wasm_mtime


def test_build_site_refuses_a_foreign_folder(tmp_path, sources):
    pyo, whl, demos = sources
    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="refusing"):
        build_site(whl, foreign, pyodide_dir=pyo, demos_dir=demos)
    assert (foreign / "notes.txt").read_text() == "mine"


def test_build_site_wants_a_wheel_and_pyodide(tmp_path, sources):
    pyo, whl, demos = sources
    with pytest.raises(SystemExit, match="not an ember"):
        build_site(tmp_path / "x.whl", tmp_path / "o", pyodide_dir=pyo, demos_dir=demos)
    with pytest.raises(SystemExit, match="no Pyodide"):
        build_site(whl, tmp_path / "o", pyodide_dir=tmp_path, demos_dir=demos)


def test_build_site_serves_extra_wheels(tmp_path, sources):
    # Pure-Python dependencies for the page (jinja2...): served under wheels/, listed in the
    # manifest with their hashes (versioned URLs, so the browser keeps them).
    pyo, whl, demos = sources
    extra = tmp_path / "extra"
    extra.mkdir()
    with zipfile.ZipFile(extra / "dep-1.0-py3-none-any.whl", "w") as z:
        z.writestr("dep/__init__.py", "")
    (extra / "native-1.0-cp312-cp312-linux_x86_64.whl").write_bytes(b"not for Pyodide")
    out = build_site(whl, tmp_path / "out", pyodide_dir=pyo, demos_dir=demos, extra_wheels_dir=extra)
    m = json.loads((out / "manifest.json").read_text())
    assert m["extra_wheels"] == ["wheels/dep-1.0-py3-none-any.whl"]
    assert (out / "wheels" / "dep-1.0-py3-none-any.whl").read_bytes() == (extra / "dep-1.0-py3-none-any.whl").read_bytes()
    assert not (out / "wheels" / "native-1.0-cp312-cp312-linux_x86_64.whl").exists()
    import hashlib
    assert m["files"]["wheels/dep-1.0-py3-none-any.whl"] == hashlib.sha256(
        (extra / "dep-1.0-py3-none-any.whl").read_bytes()).hexdigest()[:16]
