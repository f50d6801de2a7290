"""Booting a revisit from a Pyodide memory snapshot (wasm/snapshot.js, issue 19 part 3).

One browser context is one returning visitor: its first page boots the normal way and makes a
snapshot in the background; the next page restores it. A corrupt entry, one made for another
wheel and one Pyodide refuses are each dropped, and the page boots the normal way with the same
results and a note saying why. The other e2e tests run with ``EMBER_SNAPSHOT = false``; these
open their own context without it.
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


@pytest.fixture
def visitor(browser, server):
    context = browser.new_context()
    yield context
    context.close()


@pytest.fixture(scope="module")
def returning(browser, server):
    """One returning visitor for the first two tests: the first leaves a fresh, valid snapshot
    stored (its last visit makes one), which the second spoils in two ways; run alone, the
    second makes its own. Saves a normal boot plus a snapshot (~15 s in CI)."""
    context = browser.new_context()
    yield context
    context.close()


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
    out1 = {"sum": 4.0, "mm": [[7.0, 10.0], [15.0, 22.0]]}     # CHECK's answers, whatever the boot
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


def test_snapshot_false_never_reads_or_makes_one(visitor, server):
    p = visitor.new_page()
    p.set_default_timeout(240_000)
    p.goto(server)
    info = p.evaluate("""async () => {
        const mod = await import("/wasm/ember.js");
        const py = await mod.loadEmber({ snapshot: false });
        return { snapshot: py.ember.snapshot, saved: await mod.snapshotSaved() };
    }""")
    assert info["snapshot"]["used"] is False and info["snapshot"]["note"].startswith("snapshots off")
    assert info["saved"] is None
    assert not _stored(p)
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
