// snapshot.js: boot Pyodide from a memory snapshot taken after `import ember` (revisits).
//
// Used by ember.js; not an API of its own. Pyodide 314's snapshots are experimental
// (`loadPyodide({_makeSnapshot: true})`, `pyodide.makeMemorySnapshot()`,
// `loadPyodide({_loadSnapshot})`), so everything here is checked and every failure falls back to
// the normal boot:
//
// - The snapshot is the whole wasm heap after `import ember` and the imports a page's first
//   answer needs (PRELOAD): restoring it skips Python's start-up and compiling ember's sources
//   (the wheel ships .py files; Pyodide compiles each on import). It is made once per ember
//   wheel, in a Worker of its own (a second, throwaway Pyodide: the page's own instance never
//   runs with `_makeSnapshot`, which wraps every JS global in a recording proxy), after the
//   page's boot and a delay, and stored in the Cache API ("ember-snapshot", one entry per site).
// - An entry is used only when its metadata names this Pyodide, this ember wheel (sha256) and
//   these extra wheels, and its body has the recorded length and SHA-256. Anything else is
//   deleted (stale or corrupt) and the page boots the normal way; so is an entry that Pyodide
//   refuses (its build id, its magic number) or that restores into a Python without ember.
// - A site may also serve a snapshot made when it was built (web/site.py: headless Chromium runs
//   this file's maker on the built site; manifest "snapshot" = {path, bytes, body, sha256, meta}):
//   a browser without a stored entry (a first visit) fetches it instead of booting Python, and
//   uses it only when its recorded metadata names this Pyodide, ember wheel, extra wheels and
//   this file's FORMAT/PRELOAD, and the body has the recorded length and SHA-256. Anything else
//   is refused (nothing is run), and the page boots the normal way. Either way the browser then
//   makes its own entry in the background (scheduleSnapshot says why not a copy of the site's).
// - The file system is not part of a snapshot: ember.js unpacks the wheels again after the
//   restore (the modules are in memory already; lazy imports and package data need the files).
//
// What happened is in the page's info: `info.snapshot = {used, source, note, bytes, ms, readMs,
// checkedMs}` (source: "browser" for the Cache API entry, "site" for the site's prebuilt one;
// ms: from loadPyodide's call to a restored Python; readMs / checkedMs: the entry read from the
// Cache API or the site / and its SHA-256 checked, from the lookup's start) (ember.js
// passes it on to Python, `ember.wasm.boot_info()`).

const CACHE = "ember-snapshot";
const FORMAT = 2;                                 // bump when what a snapshot holds changes
const MAKER_NAME = "ember-snapshot-maker";
// Imported before the snapshot is taken (each one that fails to import is skipped): what
// `ember.wasm.init()`, loading safetensors weights, `ember.nn` models and `ember.compile`
// import on a page's way to its first answer. Imports only: no JS object may be held (a snapshot
// can restore only JS globals by their path).
export const PRELOAD = [
  "ember.nn", "ember.io", "ember.io.safetensors", "ember.wasm.runtime", "ember.wasm.backend",
  "ember.wasm.plan_exec", "ember.wasm.team", "ember.backends.python", "importlib.resources", "importlib.readers",
  "ember.onnx", "ember.webgpu",
  // the wasm backend's op modules, imported by ember.wasm.init(): without them a revisit compiled
  // ~40 KB of their sources there (~20 ms in Node)
  "ember.wasm.ops_cast", "ember.wasm.ops_elementwise", "ember.wasm.ops_layout", "ember.wasm.ops_linalg",
  "ember.wasm.ops_quant", "ember.wasm.ops_reduce", "importlib.resources._adapters",
];

function snapshotUrl(base) {
  return new URL("__ember_snapshot__", base).href;
}

/** What a snapshot for this site's manifest must have been made from. */
export function snapshotMeta(manifest) {
  const extras = {};
  for (const w of manifest.extra_wheels || []) extras[w] = (manifest.files || {})[w] || null;
  return { format: FORMAT, pyodide_version: manifest.pyodide_version, ember_version: manifest.ember_version,
           wheel_sha256: manifest.wheel_sha256, extras, preload: PRELOAD };
}

// Stored body: the heap without its all-zero pages (about half of it after `import ember`):
// u32 PACK_MAGIC, u32 page size, u32 snapshot length, u32 page count, one byte per page (1:
// stored), then the stored pages in order.
const PACK_MAGIC = 0x454d5331;   // "EMS1"
const PAGE = 65536;

function pack(snap) {
  const n = Math.ceil(snap.length / PAGE);
  const keep = new Uint8Array(n);
  let kept = 0;
  for (let i = 0; i < n; i++) {
    const page = snap.subarray(i * PAGE, Math.min(snap.length, (i + 1) * PAGE));
    const words = new Uint32Array(page.buffer, page.byteOffset, page.length >> 2);
    let zero = words.every((w) => w === 0);
    for (let j = words.length << 2; zero && j < page.length; j++) zero = page[j] === 0;
    if (!zero) {
      keep[i] = 1;
      kept += page.length;
    }
  }
  const head = 16 + n;
  const out = new Uint8Array(head + kept);
  new DataView(out.buffer).setUint32(0, PACK_MAGIC, true);
  new DataView(out.buffer).setUint32(4, PAGE, true);
  new DataView(out.buffer).setUint32(8, snap.length, true);
  new DataView(out.buffer).setUint32(12, n, true);
  out.set(keep, 16);
  let at = head;
  for (let i = 0; i < n; i++) {
    if (!keep[i]) continue;
    const page = snap.subarray(i * PAGE, Math.min(snap.length, (i + 1) * PAGE));
    out.set(page, at);
    at += page.length;
  }
  return out;
}

function unpack(body) {
  const dv = new DataView(body.buffer, body.byteOffset, body.byteLength);
  if (body.length < 16 || dv.getUint32(0, true) !== PACK_MAGIC) throw new Error("not a packed snapshot");
  const page = dv.getUint32(4, true), length = dv.getUint32(8, true), n = dv.getUint32(12, true);
  if (n !== Math.ceil(length / page) || body.length < 16 + n) throw new Error("a packed snapshot's header is inconsistent");
  const out = new Uint8Array(length);
  let at = 16 + n;
  for (let i = 0; i < n; i++) {
    if (!body[16 + i]) continue;
    const len = Math.min(length, (i + 1) * page) - i * page;
    if (at + len > body.length) throw new Error("a packed snapshot is shorter than its header says");
    out.set(body.subarray(at, at + len), i * page);
    at += len;
  }
  if (at !== body.length) throw new Error("a packed snapshot is longer than its header says");
  return out;
}

function sameMeta(a, b) {
  return JSON.stringify(a) === JSON.stringify(b);
}

async function sha256Hex(bytes) {
  const d = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return Array.from(d, (x) => x.toString(16).padStart(2, "0")).join("");
}

async function openCache() {
  if (!globalThis.caches || !globalThis.crypto?.subtle) return null;
  try {
    return await caches.open(CACHE);
  } catch (e) {
    return null;
  }
}

/** Where snapshots cannot be used at all here: a reason, or null. */
export function unavailable() {
  if (!globalThis.caches) return "no Cache API here (not a secure context?)";
  if (!globalThis.crypto?.subtle) return "no crypto.subtle here (not a secure context?)";
  if (typeof Worker !== "function") return "no Worker here to make a snapshot in";
  return null;
}

/** Delete this site's snapshot (a stale, corrupt or refused one). */
export async function dropSnapshot(base) {
  const cache = await openCache();
  if (cache) {
    try {
      await cache.delete(snapshotUrl(base));
    } catch (e) { /* nothing to drop */ }
  }
}

/** The SHA-256 check (WebCrypto, off this thread) runs while the body is unpacked; the heap is
 *  handed to Pyodide only once both are done: Python never runs on bytes that failed it.
 *  `bodyP`: a promise of the packed body; `want`: {body, sha256}; on a mismatch `onBad()` runs
 *  and both promises reject with the message `corrupt`. */
function checkedHeap(bodyP, want, t, timing, onBad, corrupt) {
  const checked = bodyP.then(async (b) => {
    const ok = b.length === want.body && (await sha256Hex(b)) === want.sha256;
    timing.checkedMs = performance.now() - t;
    if (!ok) {
      await onBad();
      throw new Error(corrupt);
    }
  });
  const bytes = bodyP.then(async (b) => {
    timing.readMs = performance.now() - t;
    let heap, error;
    try {
      heap = unpack(b);
    } catch (e) {
      error = e;
    }
    timing.unpackedMs = performance.now() - t;
    await checked;   // a corrupt body says so first
    if (error) throw error;
    return heap;
  });
  bytes.catch(() => {});   // the caller awaits both (bytes through loadPyodide)
  checked.catch(() => {});
  return { bytes, checked };
}

/** The site's prebuilt snapshot (manifest "snapshot", made by web/site.py) when it was made for
 *  this manifest and this file: {bytes, checked, note, timing, source: "site"}, or {bytes: null,
 *  note}. The download starts at once; nothing is handed out before its length and SHA-256
 *  match the manifest's record. */
export function siteSnapshot(base, manifest, t = performance.now()) {
  const rec = manifest.snapshot;
  if (!rec || typeof rec !== "object") return { bytes: null, note: "no snapshot stored yet" };
  if (typeof rec.path !== "string" || !/^[0-9a-f]{64}$/.test(String(rec.sha256)) || !(rec.body > 0) ||
      !sameMeta(rec.meta, snapshotMeta(manifest))) {
    return { bytes: null, note: "the site's snapshot was made for another ember, Pyodide or loader: not used" };
  }
  const url = new URL(rec.path, base);
  if (url.origin !== new URL(base).origin) return { bytes: null, note: "the site's snapshot is not on this site: not used" };
  url.searchParams.set("v", rec.sha256.slice(0, 16));
  const timing = {};
  const bodyP = fetch(url.href).then(async (r) => {
    if (!r.ok) throw new Error(`the site's snapshot could not be downloaded (HTTP ${r.status})`);
    return new Uint8Array(await r.arrayBuffer());
  });
  bodyP.catch(() => {});
  const { bytes, checked } = checkedHeap(bodyP, rec, t, timing, async () => {},
                                         "the site's snapshot was corrupt (its length or SHA-256 differs): not used");
  return { bytes, checked, note: "booted from the site's memory snapshot", timing, source: "site" };
}

/** Look for a snapshot for `manifest` (a manifest or a promise of one): {bytes, note, source}.
 *  The browser's own entry (Cache API) first, else the site's prebuilt one (siteSnapshot).
 *  `bytes` is null when there is none to use (`note` says why; a stale entry is deleted), else a
 *  promise of the snapshot that rejects (and deletes a stored entry) when its length or SHA-256
 *  is not what was recorded. The entry is looked up and its body read while the manifest is
 *  still on its way (a revisit's manifest request is revalidated: one round trip saved); nothing
 *  is handed out before the entry's metadata matches the manifest. */
export async function findSnapshot(base, manifest) {
  const timing = {};
  const why = unavailable();
  if (why) return { bytes: null, note: why };
  const cache = await openCache();
  if (!cache) return { bytes: null, note: "the Cache API is not usable here" };
  const failedP = cache.match(snapshotUrl(base) + "?failed");
  const respP = cache.match(snapshotUrl(base));
  const t = performance.now();
  // the body's read starts as soon as the entry is found (the read is most of a revisit's wait)
  const bodyP = respP.then((r) => (r ? r.arrayBuffer().then((b) => new Uint8Array(b)) : null));
  bodyP.catch(() => {});
  manifest = await manifest;
  const resp = await respP;
  let stored = null;
  if (resp) {
    try {
      stored = JSON.parse(resp.headers.get("X-Ember-Snapshot") || "null");
    } catch (e) { /* unreadable metadata: dropped below */ }
  }
  if (!resp || !stored || !sameMeta(stored.meta, snapshotMeta(manifest))) {
    let note = "no snapshot stored yet";
    if (resp) {
      await dropSnapshot(base);
      note = "the stored snapshot was made for another ember or Pyodide: dropped";
    }
    const site = siteSnapshot(base, manifest, t);
    if (site.bytes) return site;
    if (manifest.snapshot) note = site.note;
    const failed = await failedP;
    if (failed && failed.headers.get("X-Ember-Snapshot") === JSON.stringify(snapshotMeta(manifest))) {
      return { bytes: null, note: `making a snapshot failed for this ember: ${await failed.text()}`, failed: true };
    }
    return { bytes: null, note };
  }
  const { bytes, checked } = checkedHeap(bodyP, stored, t, timing, () => dropSnapshot(base),
                                         "the stored snapshot was corrupt (its length or SHA-256 differs): dropped");
  return { bytes, checked, note: "booted from a memory snapshot", timing, source: "browser" };
}

/** Make and store a snapshot in a Worker of its own; resolves to {ok, bytes, ms, error}.
 *  `store: false` (the site builder, web/site.py): nothing is stored; the result also has
 *  `body` (the packed snapshot, a Uint8Array) and `record` ({meta, bytes, body, sha256}). */
export function makeSnapshot(base, manifest, wheels, { store = true } = {}) {
  return new Promise((resolve) => {
    let w;
    try {
      w = new Worker(new URL(import.meta.url), { type: "module", name: MAKER_NAME });
    } catch (e) {
      resolve({ ok: false, error: `cannot start the snapshot worker: ${e.message || e}` });
      return;
    }
    const done = (r) => {
      w.terminate();
      resolve(r);
    };
    w.onmessage = (e) => done(e.data);
    w.onerror = (e) => {
      e.preventDefault();
      done({ ok: false, error: `the snapshot worker failed: ${e.message || "did not load"}` });
    };
    w.postMessage({ base, manifest, wheels, store });
  });
}

// ---- wheels unpacked by the browser -----------------------------------------------------------

/** The files of a zip (a wheel): [{name, data}] with directories left out, inflated by the
 *  browser's DecompressionStream -- natively, concurrently, and while Pyodide is still starting,
 *  instead of by Python's zipfile once it has. Throws on anything it does not read (zip64,
 *  encryption, a method other than stored/deflated, an entry outside the archive); ember.js
 *  then unpacks with Pyodide as before. */
export async function unzip(bytes) {
  if (typeof DecompressionStream !== "function") throw new Error("no DecompressionStream here");
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let eocd = -1;
  for (let i = bytes.length - 22; i >= Math.max(0, bytes.length - 22 - 65535); i--) {
    if (dv.getUint32(i, true) === 0x06054b50) { eocd = i; break; }
  }
  if (eocd < 0) throw new Error("not a zip (no end of central directory)");
  const count = dv.getUint16(eocd + 10, true);
  let at = dv.getUint32(eocd + 16, true);
  const names = new TextDecoder();
  const jobs = [];
  for (let k = 0; k < count; k++) {
    if (at + 46 > bytes.length || dv.getUint32(at, true) !== 0x02014b50) throw new Error("bad central directory");
    const flags = dv.getUint16(at + 8, true), method = dv.getUint16(at + 10, true);
    const csize = dv.getUint32(at + 20, true), size = dv.getUint32(at + 24, true);
    const nlen = dv.getUint16(at + 28, true), xlen = dv.getUint16(at + 30, true), clen = dv.getUint16(at + 32, true);
    const local = dv.getUint32(at + 42, true);
    const name = names.decode(bytes.subarray(at + 46, at + 46 + nlen));
    at += 46 + nlen + xlen + clen;
    if (flags & 1) throw new Error(`${name}: encrypted`);
    if (csize === 0xffffffff || size === 0xffffffff || local === 0xffffffff) throw new Error(`${name}: zip64`);
    if (name.endsWith("/")) continue;
    if (name.startsWith("/") || name.split("/").includes("..")) throw new Error(`${name}: outside the archive`);
    if (local + 30 > bytes.length || dv.getUint32(local, true) !== 0x04034b50) throw new Error(`${name}: bad local header`);
    const start = local + 30 + dv.getUint16(local + 26, true) + dv.getUint16(local + 28, true);
    if (start + csize > bytes.length) throw new Error(`${name}: past the end of the archive`);
    const raw = bytes.subarray(start, start + csize);
    if (method === 0) jobs.push(Promise.resolve({ name, data: raw }));
    else if (method === 8) {
      jobs.push(new Response(new Blob([raw]).stream().pipeThrough(new DecompressionStream("deflate-raw")))
        .arrayBuffer().then((b) => {
          if (b.byteLength !== size) throw new Error(`${name}: ${b.byteLength} bytes inflated, ${size} expected`);
          return { name, data: new Uint8Array(b) };
        }));
    } else throw new Error(`${name}: compression method ${method}`);
  }
  return Promise.all(jobs);
}

/** Write unzip()'s files under `dir` of Pyodide's file system. */
export function writeFiles(pyodide, dir, files) {
  const made = new Set();
  for (const { name, data } of files) {
    const path = `${dir}/${name}`;
    const parent = path.slice(0, path.lastIndexOf("/"));
    if (!made.has(parent)) {
      pyodide.FS.mkdirTree(parent);
      made.add(parent);
    }
    pyodide.FS.writeFile(path, data);
  }
}

// ---- what ember.js calls --------------------------------------------------------------------

let saving = null;   // the background making of this page (a promise), or null

/** findSnapshot, started by ember.js as its boot starts (the lookup, and a first visit's
 *  download of the site's snapshot, run while pyodide.mjs loads); never rejects. */
export function lookForSnapshot(base, manifestP, mode = "auto") {
  if (!mode) return Promise.resolve({ bytes: null, note: "snapshots off (snapshot: false)", off: true });
  return findSnapshot(base, manifestP).catch((e) => ({ bytes: null, note: `looking for a snapshot failed: ${e.message || e}` }));
}

/** loadPyodide from a snapshot when a valid one is stored or served, else the normal way.
 *  `mode`: "auto" | false; `foundP`: lookForSnapshot's promise when the caller started it.
 *  Returns {pyodide, snapshot: {used, source, note, bytes, ms}}. */
export async function startPyodide(loadPyodide, indexURL, base, manifestP, mode = "auto", foundP = null) {
  const plain = () => loadPyodide({ indexURL, packages: [] });   // packages: []: never a CDN
  const found = await (foundP || lookForSnapshot(base, manifestP, mode));
  if (found.off) return { pyodide: await plain(), snapshot: { used: false, note: found.note } };
  const snapshot = { used: false, note: found.note, failed: !!found.failed };
  // (Pyodide reads the whole snapshot before it starts compiling its module: ember.js's boot has
  // started a compile of the same bytes already, which V8 shares with Pyodide's. Measured on a
  // loaded 2-core machine: restore after the read ~1.38 -> ~1.13 s, noisy.)
  if (found.bytes) {
    const t = performance.now();
    const site = found.source === "site";
    try {
      const pyodide = await loadPyodide({ indexURL, packages: [], _loadSnapshot: found.bytes });
      await found.checked;
      snapshot.used = true;
      snapshot.source = found.source;
      snapshot.bytes = (await found.bytes).length;
      snapshot.ms = performance.now() - t;     // read + checked + restored (with Pyodide's wasm start)
      Object.assign(snapshot, found.timing);
      return { pyodide, snapshot };
    } catch (e) {
      if (!site) await dropSnapshot(base);
      const first = String(e.message || e).split("\n")[0];
      snapshot.note = /corrupt|could not be downloaded/.test(first) ? first
        : site ? `the site's snapshot did not restore (${first}): not used`
        : `the stored snapshot did not restore (${first}): dropped`;
    }
  }
  return { pyodide: await plain(), snapshot };
}

/** After a restore and the wheels' unpacking: does Python hold this manifest's ember, with its
 *  files? Throws (after dropping the snapshot) when not, so the caller boots the normal way. */
export async function checkRestored(pyodide, base, manifest) {
  let ok = false;
  try {
    // `random` was seeded when the snapshot was made: every page restoring the same snapshot
    // (every visitor, for a site's) would draw the same numbers. Seeded again from the OS here.
    ok = pyodide.runPython("import importlib, os, sys\nimportlib.invalidate_caches()\n" +
                           "if 'random' in sys.modules: sys.modules['random'].seed()\n" +
                           `'ember' in sys.modules and sys.modules['ember'].__version__ == ${JSON.stringify(manifest.ember_version)} ` +
                           "and os.path.isfile(sys.modules['ember'].__file__)");
  } catch (e) { /* ok stays false */ }
  if (!ok) {
    await dropSnapshot(base);
    throw new Error("the snapshot restored a Python without this ember: dropped");
  }
}

/** Make a snapshot in the background `delayMs` after the boot, unless this browser's own one was
 *  used or making one failed for this ember before; `snapshot` (the info) gets `saving: true`.
 *  `wheels`: the wheels' bytes (or a function returning a promise of them, called then). After a boot from the site's snapshot one
 *  is made too, as after a normal boot: measured here, revisits that restored a copy of the
 *  site's snapshot ran Python 2-4x slower for their first second (a pure-Python loop 77-150 ms
 *  against 29-40) than after a first visit whose background maker booted a second Pyodide the
 *  normal way -- V8's code cache of pyodide.asm.wasm, written during a first visit that ran
 *  little Python, holds less optimized code (a 4 s Python run on the first visit got half of
 *  it back). */
export function scheduleSnapshot(base, manifest, wheels, snapshot, delayMs = 1500) {
  if ((snapshot.used && snapshot.source !== "site") || snapshot.failed || unavailable() ||
      snapshot.note.startsWith("snapshots off")) return;
  snapshot.saving = true;
  saving = new Promise((r) => setTimeout(r, delayMs))
    .then(async () => makeSnapshot(base, manifest, await (typeof wheels === "function" ? wheels() : wheels)))
    .catch((e) => ({ ok: false, error: String(e && e.message ? e.message : e) }));
}

/** The background making's result {ok, bytes, ms, error}, or null when none was started. */
export async function snapshotSaved() {
  return saving ? await saving : null;
}

// ---- the maker (runs in its Worker) ---------------------------------------------------------

async function make({ base, manifest, wheels, store = true }) {
  const t0 = performance.now();
  const indexURL = new URL("pyodide/", base).href;
  const { loadPyodide } = await import(new URL("pyodide.mjs", indexURL).href);
  const py = await loadPyodide({ indexURL, packages: [], _makeSnapshot: true });
  const sitePackages = py.runPython("import site; site.getsitepackages()[0]");
  for (const whl of wheels) py.unpackArchive(whl, "wheel", { extractDir: sitePackages });
  py.runPython("import importlib; importlib.invalidate_caches(); import ember");
  py.globals.set("_ember_preload", py.toPy(PRELOAD));
  py.runPython("import importlib\nfor _m in _ember_preload:\n    try:\n        importlib.import_module(_m)\n" +
               "    except Exception:\n        pass\ndel _m, _ember_preload");
  const heap = py.makeMemorySnapshot();
  const body = pack(heap);
  const stored = { meta: snapshotMeta(manifest), bytes: heap.length, body: body.length, sha256: await sha256Hex(body) };
  if (!store) return { ok: true, bytes: heap.length, stored: body.length, ms: performance.now() - t0, body, record: stored };
  const cache = await openCache();
  if (!cache) throw new Error("the Cache API is not usable here");
  await cache.put(snapshotUrl(base), new Response(body, { headers: {
    "Content-Type": "application/octet-stream", "X-Ember-Snapshot": JSON.stringify(stored) } }));
  return { ok: true, bytes: heap.length, stored: body.length, ms: performance.now() - t0 };
}

if (typeof WorkerGlobalScope !== "undefined" && globalThis instanceof WorkerGlobalScope &&
    globalThis.name === MAKER_NAME) {
  self.onmessage = async (e) => {
    try {
      const r = await make(e.data);
      self.postMessage(r, r.body ? [r.body.buffer] : []);
    } catch (err) {
      const error = String(err && err.message ? err.message : err).split("\n").slice(-2).join(" ");
      try {   // remembered for this ember: later visits do not try again
        const cache = e.data.store === false ? null : await openCache();
        if (cache) await cache.put(snapshotUrl(e.data.base) + "?failed", new Response(error, { headers: {
          "X-Ember-Snapshot": JSON.stringify(snapshotMeta(e.data.manifest)) } }));
      } catch (e2) { /* not remembered: tried again next time */ }
      self.postMessage({ ok: false, error });
    }
  };
}
