// Run a Python script inside Pyodide under Node, with the ember wheel installed (offline).
//
//   node wasm/run_pyodide.mjs --wheel dist/ember-0.1.0-py3-none-any.whl \
//        [--mount HOST_DIR:/guest/dir ...] [--cwd /guest/dir] script.py [args...]
//
// Boots the npm Pyodide next to this file (wasm/node_modules/pyodide), unpacks the wheel into
// site-packages, mounts host folders with NODEFS, sets sys.argv = [script.py, args...] and runs
// the script with runPythonAsync (top-level await allowed). Python's stdout/stderr go to ours.
// Exit status: 0, the script's SystemExit code, or 1 on an uncaught exception (traceback on
// stderr). tests/test_pyodide.py uses it to run the op cases inside Pyodide.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));

function usage(msg) {
  process.stderr.write(`run_pyodide: ${msg}\nusage: node run_pyodide.mjs --wheel W ` +
                       `[--mount HOST:GUEST ...] [--cwd DIR] script.py [args...]\n`);
  process.exit(2);
}

const argv = process.argv.slice(2);
let wheel = null, cwd = null, script = null;
const mounts = [];
while (argv.length) {
  const a = argv.shift();
  if (a === "--wheel") wheel = argv.shift();
  else if (a === "--mount") {
    const spec = argv.shift() || "";
    const i = spec.lastIndexOf(":");
    if (i <= 0) usage(`--mount wants HOST:GUEST, got ${JSON.stringify(spec)}`);
    mounts.push([path.resolve(spec.slice(0, i)), spec.slice(i + 1)]);
  } else if (a === "--cwd") cwd = argv.shift();
  else { script = a; break; }
}
if (!wheel) usage("--wheel is required");
if (!script) usage("no script given");
if (!fs.existsSync(wheel)) usage(`no wheel at ${wheel}`);
if (!fs.existsSync(script)) usage(`no script at ${script}`);

const pyodideDir = path.join(here, "node_modules", "pyodide");
if (!fs.existsSync(path.join(pyodideDir, "pyodide.asm.wasm"))) {
  usage(`Pyodide is not installed in ${pyodideDir}: run 'python build.py setup'`);
}
const { loadPyodide } = await import(path.join(pyodideDir, "pyodide.mjs"));

const t0 = performance.now();
const py = await loadPyodide({
  indexURL: pyodideDir + path.sep,
  packages: [],
  stdout: (s) => process.stdout.write(s + "\n"),
  stderr: (s) => process.stderr.write(s + "\n"),
});
const bootMs = performance.now() - t0;

// A Node Buffer is not a plain Uint8Array to Pyodide: copy into one.
const sitePackages = py.runPython("import site; site.getsitepackages()[0]");
py.unpackArchive(new Uint8Array(fs.readFileSync(wheel)), "wheel", { extractDir: sitePackages });
for (const [host, guest] of mounts) {
  py.FS.mkdirTree(guest);
  py.FS.mount(py.FS.filesystems.NODEFS, { root: host }, guest);
}
if (cwd) py.FS.chdir(cwd);
py.globals.set("_ember_argv", py.toPy([script, ...argv]));
py.globals.set("_ember_boot_ms", bootMs);

let code = 0;
try {
  py.runPython("import sys, importlib; sys.argv = list(_ember_argv); importlib.invalidate_caches()");
  await py.runPythonAsync(fs.readFileSync(script, "utf8"), { filename: path.basename(script) });
} catch (e) {
  const msg = String(e && e.message ? e.message : e);
  const exit = /SystemExit: (\d+)\s*$/.exec(msg.trim());
  if (exit) code = Number(exit[1]);
  else if (/SystemExit(: None)?\s*$/.test(msg.trim())) code = 0;
  else {
    process.stderr.write(msg + "\n");
    code = 1;
  }
}
process.exit(code);
