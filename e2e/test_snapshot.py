"""Booting from a Pyodide memory snapshot (wasm/snapshot.js, issue 19 part 3).

The site serves a snapshot made when it was built (web/site.py, manifest "snapshot"): a first
visit (a fresh context) restores it and makes the browser's own in the background, which the
revisit restores. A corrupt site snapshot and one made for another wheel are each refused (the latter is not even
downloaded), and the page boots the normal way with the same results and a note saying why.
(A snapshot Pyodide refuses takes the same path for both sources: tested with a stored entry
below, ~9 s a boot kept out of the suite.)

Without a site snapshot (these tests hide it by serving the manifest without "snapshot"), one
browser context is one returning visitor: its first page boots the normal way and makes a
snapshot in the background; the next page restores it. A corrupt entry, one made for another
wheel and one Pyodide refuses are each dropped, likewise. The other e2e tests run with
``EMBER_SNAPSHOT = false``; these open their own context without it.
"""
from __future__ import annotations

import json

import pytest

BOOT = """async () => {
    const mod = await import("/wasm/ember.js");
    window.pyodide = await mod.loadEmber({});
    const e = window.pyodide.ember;
    return { snapshot: e.snapshot, wasm: e.wasm, wasmError: e.wasmError, version: e.version };
}"""

# The same answers whatever way Python started: a python-device sum and a wasm matmul.
CHECK = """import ember, ember.wasm, json
a = ember.tensor([[1.0, 2.0], [3.0, 4.0]], device="wasm")
json.dumps({"boot": ember.wasm.boot_info(), "sum": ember.tensor([1.5, 2.5]).sum().item(),
            "mm": (a @ a).tolist(), "lazy": __import__("ember.tokenizers").__name__})"""

ENTRY = "__ember_snapshot__"


def _visit(context, server):
    p = context.new_page()
    p.set_default_timeout(240_000)
    errors = []
    p.on("pageerror", lambda exc: errors.append(str(exc)))
    p.goto(server)
    info = p.evaluate(BOOT)
    out = json.loads(p.evaluate("(code) => window.pyodide.runPythonAsync(code)", CHECK))
    assert not errors, errors
    return p, info, out


def _edit_entry(page, js_body: str):
    """Rewrite the stored snapshot entry: ``js_body`` gets (bytes, meta) and returns [bytes, meta]."""
    page.evaluate("""async (body) => {
        const cache = await caches.open("ember-snapshot");
        const url = new URL("%s", location.origin + "/").href;
        const r = await cache.match(url);
        let bytes = new Uint8Array(await r.arrayBuffer());
        let meta = JSON.parse(r.headers.get("X-Ember-Snapshot"));
        [bytes, meta] = await new Function("bytes", "meta", body)(bytes, meta);
        await cache.put(url, new Response(bytes, { headers: { "X-Ember-Snapshot": JSON.stringify(meta) } }));
    }""" % ENTRY, js_body)


def _stored(page) -> bool:
    return page.evaluate("""async () => !!(await (await caches.open("ember-snapshot"))
        .match(new URL("%s", location.origin + "/").href))""" % ENTRY)


def _edit_manifest(context, edit):
    """Serve manifest.json to ``context`` as ``edit(manifest)`` leaves it (pages and workers)."""
    def handle(route):
        resp = route.fetch()
        m = resp.json()
        edit(m)
        headers = {k: v for k, v in resp.headers.items() if k.lower() not in ("content-length", "content-encoding")}
        route.fulfill(status=200, headers=headers, body=json.dumps(m))
    context.route("**/manifest.json", handle)


def _hide_site_snapshot(context):
    _edit_manifest(context, lambda m: m.pop("snapshot", None))


def _edit_site_snapshot(context, edit):
    """Serve the site's snapshot file to ``context`` as ``edit(bytearray)`` leaves it."""
    def handle(route):
        resp = route.fetch()
        body = bytearray(resp.body())
        edit(body)
        headers = {k: v for k, v in resp.headers.items() if k.lower() not in ("content-length", "content-encoding")}
        route.fulfill(status=200, headers=headers, body=bytes(body))
    context.route("**/*-snapshot.bin*", handle)


def _site_snapshot(site_dir) -> dict:
    snap = json.loads((site_dir / "manifest.json").read_text()).get("snapshot")
    if not snap:
        pytest.skip("this site has no prebuilt snapshot (web/site.py needs Playwright and Chromium)")
    return snap


@pytest.fixture
def visitor(browser, server):
    context = browser.new_context()
    _hide_site_snapshot(context)
    yield context
    context.close()


@pytest.fixture
def newcomer(browser, server):
    """A fresh context that sees the site as served (its prebuilt snapshot included)."""
    context = browser.new_context()
    yield context
    context.close()


@pytest.fixture(scope="module")
def returning(browser, server):
    """One returning visitor for the two tests below it: the first leaves a fresh, valid
    snapshot stored (its last visit makes one), which the second spoils in two ways; run alone,
    the second makes its own. Saves a normal boot plus a snapshot (~15 s in CI)."""
    context = browser.new_context()
    _hide_site_snapshot(context)
    yield context
    context.close()


OUT = {"sum": 4.0, "mm": [[7.0, 10.0], [15.0, 22.0]], "lazy": "ember"}   # CHECK's answers, whatever the boot


def test_first_visit_boots_from_the_sites_snapshot(newcomer, server, site_dir, request_log):
    snap = _site_snapshot(site_dir)
    request_log.clear()
    p1, first, out1 = _visit(newcomer, server)
    assert first["snapshot"]["used"] is True and first["snapshot"]["source"] == "site", first
    assert first["snapshot"]["bytes"] == snap["bytes"]
    assert first["wasm"] is True, first["wasmError"]
    assert out1["boot"] == {"snapshot": True, "snapshot_note": "booted from the site's memory snapshot"}
    assert {k: v for k, v in out1.items() if k != "boot"} == OUT
    asked = [r for r in request_log if r.split("?")[0] == "/" + snap["path"]]
    assert asked == [f"/{snap['path']}?v={snap['sha256'][:16]}"], request_log
    # The browser makes its own in the background, as after a normal boot (see scheduleSnapshot).
    saved = p1.evaluate("async () => (await import('/wasm/ember.js')).snapshotSaved()")
    assert saved["ok"] and saved["bytes"] > 1 << 20, saved
    assert _stored(p1)
    p1.close()
    request_log.clear()
    p2, again, out2 = _visit(newcomer, server)
    assert again["snapshot"]["used"] is True and again["snapshot"]["source"] == "browser", again
    assert {k: v for k, v in out2.items() if k != "boot"} == OUT
    assert not any(r.split("?")[0] == "/" + snap["path"] for r in request_log), request_log
    assert p2.evaluate("async () => (await import('/wasm/ember.js')).snapshotSaved()") is None
    p2.close()


def test_a_corrupt_site_snapshot_is_refused(newcomer, server, site_dir):
    _site_snapshot(site_dir)

    def flip(body):
        body[len(body) // 2] ^= 0x5A
    _edit_site_snapshot(newcomer, flip)
    p, info, out = _visit(newcomer, server)
    assert info["snapshot"]["used"] is False, info
    assert info["snapshot"]["note"] == "the site's snapshot was corrupt (its length or SHA-256 differs): not used"
    assert out["boot"]["snapshot"] is False and {k: v for k, v in out.items() if k != "boot"} == OUT
    assert info["wasm"] is True, info["wasmError"]
    p.close()


def test_a_site_snapshot_for_another_wheel_is_not_downloaded(newcomer, server, site_dir, request_log):
    snap = _site_snapshot(site_dir)

    def other(m):
        m["snapshot"]["meta"]["wheel_sha256"] = "0" * 64
    _edit_manifest(newcomer, other)
    request_log.clear()
    p, info, out = _visit(newcomer, server)
    assert info["snapshot"]["used"] is False
    assert info["snapshot"]["note"] == "the site's snapshot was made for another ember, Pyodide or loader: not used"
    assert {k: v for k, v in out.items() if k != "boot"} == OUT
    assert not any(r.split("?")[0] == "/" + snap["path"] for r in request_log), request_log
    p.close()


def test_first_visit_makes_a_snapshot_and_the_revisit_boots_from_it(returning, server):
    visitor = returning
    p1, first, out1 = _visit(visitor, server)
    assert first["snapshot"]["used"] is False and first["snapshot"]["note"] == "no snapshot stored yet"
    assert out1["boot"] == {"snapshot": False, "snapshot_note": "no snapshot stored yet"}
    saved = p1.evaluate("async () => (await import('/wasm/ember.js')).snapshotSaved()")
    assert saved["ok"], saved
    assert saved["bytes"] > 1 << 20
    p1.close()

    p2, again, out2 = _visit(visitor, server)
    assert again["snapshot"]["used"] is True, again
    assert again["snapshot"]["bytes"] == saved["bytes"]
    assert again["wasm"] is True, again["wasmError"]
    assert out2["boot"]["snapshot"] is True
    assert {k: v for k, v in out2.items() if k != "boot"} == {k: v for k, v in out1.items() if k != "boot"}
    # Nothing new is made on a visit that used the snapshot.
    assert p2.evaluate("async () => (await import('/wasm/ember.js')).snapshotSaved()") is None

    # A corrupt entry (one byte flipped, metadata intact): dropped, normal boot, same answers.
    _edit_entry(p2, "bytes[bytes.length >> 1] ^= 0x5a; return [bytes, meta];")
    p2.close()
    p3, corrupt, out3 = _visit(visitor, server)
    assert corrupt["snapshot"]["used"] is False
    assert "corrupt" in corrupt["snapshot"]["note"], corrupt
    assert out3["boot"]["snapshot"] is False and "corrupt" in out3["boot"]["snapshot_note"]
    assert {k: v for k, v in out3.items() if k != "boot"} == {k: v for k, v in out1.items() if k != "boot"}
    saved = p3.evaluate("async () => (await import('/wasm/ember.js')).snapshotSaved()")
    assert saved["ok"], saved   # a fresh one replaces it
    p3.close()


def test_stale_and_refused_snapshots_are_dropped(returning, server):
    visitor = returning
    p1 = visitor.new_page()
    p1.set_default_timeout(240_000)
    p1.goto(server)
    if not _stored(p1):     # run alone: a first visit makes the snapshot (the test above leaves one)
        p1.close()
        p1, _, _ = _visit(visitor, server)
        assert p1.evaluate("async () => (await import('/wasm/ember.js')).snapshotSaved()")["ok"]
    out1 = OUT
    # Made for another wheel: never read, dropped.
    _edit_entry(p1, "meta.meta.wheel_sha256 = '0'.repeat(64); return [bytes, meta];")
    p1.close()
    p2, stale, out2 = _visit(visitor, server)
    assert stale["snapshot"]["used"] is False and "another ember" in stale["snapshot"]["note"], stale
    assert out2["sum"] == out1["sum"] and out2["mm"] == out1["mm"]
    assert p2.evaluate("async () => (await import('/wasm/ember.js')).snapshotSaved()")["ok"]
    # Bytes that pass ember's checks (length and hash recomputed) but that Pyodide refuses
    # (its magic number, the heap's first 4 bytes, zeroed; the stored body starts with ember's
    # 16-byte header and one byte per page): dropped, normal boot.
    _edit_entry(p2, """const n = new DataView(bytes.buffer).getUint32(12, true);
        bytes.fill(0, 16 + n, 20 + n);
        return crypto.subtle.digest("SHA-256", bytes).then((d) => [bytes, {...meta,
            sha256: Array.from(new Uint8Array(d), (x) => x.toString(16).padStart(2, "0")).join("")}]);""")
    p2.close()
    p3, refused, out3 = _visit(visitor, server)
    assert refused["snapshot"]["used"] is False
    assert "did not restore" in refused["snapshot"]["note"], refused
    assert "magic" in refused["snapshot"]["note"], refused
    assert out3["sum"] == out1["sum"] and out3["mm"] == out1["mm"]
    p3.close()


def test_snapshot_false_never_reads_or_makes_one(newcomer, server, site_dir, request_log):
    visitor = newcomer   # the site's snapshot is not fetched either
    p = visitor.new_page()
    p.set_default_timeout(240_000)
    p.goto(server)
    request_log.clear()
    info = p.evaluate("""async () => {
        const mod = await import("/wasm/ember.js");
        const py = await mod.loadEmber({ snapshot: false });
        return { snapshot: py.ember.snapshot, saved: await mod.snapshotSaved() };
    }""")
    assert info["snapshot"]["used"] is False and info["snapshot"]["note"].startswith("snapshots off")
    assert info["saved"] is None
    assert not _stored(p)
    assert not any("-snapshot.bin" in r for r in request_log), request_log
    p.close()


def test_worker_mode_makes_and_uses_the_snapshot(visitor, server):
    """The demos boot ember in a Worker (loadEmber({worker: true})): the snapshot is made from
    there (a Worker of the Worker) and restored there."""
    boot = """async () => {
        const mod = await import("/wasm/ember.js");
        const w = await mod.loadEmber({ worker: true });
        const out = await w.runPythonAsync(`import ember, ember.wasm, json
json.dumps({"boot": ember.wasm.info()["snapshot"], "mm": ember.tensor([[1.0, 2.0]], device="wasm").sum().item()})`);
        const saved = await w.snapshotSaved();
        return { snapshot: w.info.snapshot, out: JSON.parse(out), saved };
    }"""
    results = []
    for _ in range(2):
        p = visitor.new_page()
        p.set_default_timeout(240_000)
        p.goto(server)
        results.append(p.evaluate(boot))
        p.close()
    first, again = results
    assert first["snapshot"]["used"] is False and first["saved"]["ok"], first
    assert again["snapshot"]["used"] is True and again["saved"] is None, again
    assert first["out"] == {"boot": False, "mm": 3.0} and again["out"] == {"boot": True, "mm": 3.0}
