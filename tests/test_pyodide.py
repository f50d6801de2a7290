"""The op cases (tests/op_cases.py + op_cases_nn.py) run inside Pyodide under Node.

The ember wheel is installed into Pyodide (Python 3.14, no numpy there) and every case runs on
the pure-Python backend; the expected values come from numpy here on the host and travel as a
JSON file. One Pyodide boot for the whole list (~3 s plus the cases), driven by
wasm/run_pyodide.mjs. Needs Node.js 20+ and the npm Pyodide (`python build.py setup`).
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")

import op_cases  # noqa: E402  (tests/ is on sys.path: pytest's rootdir conftest)

REPO = Path(__file__).resolve().parent.parent
RUNNER = REPO / "wasm" / "run_pyodide.mjs"
PYODIDE_DIR = REPO / "wasm" / "node_modules" / "pyodide"
NODE_TIMEOUT_S = 900   # generous: 2 shared cores; the run itself takes well under a minute

# Runs inside Pyodide. Reads /io/expected.json, writes /io/results.json: every case on the
# pure-Python backend and on "wasm" (the SIMD kernels on Pyodide's own memory, zero copy).
DRIVER = textwrap.dedent('''
    import json, sys, traceback
    sys.path.insert(0, "/repo/tests")
    import ember
    import op_cases

    want = json.load(open("/io/expected.json"))
    results = {}
    wasm_info = None
    try:
        wasm_info = await ember.wasm.init()
    except Exception:
        wasm_info = {"error": traceback.format_exc(limit=4)}
    for device in ("python", "wasm"):
        res = results[device] = {}
        for case in op_cases.all_cases():
            if device in case.skip:
                res[case.id] = ["skip", case.skip[device]]
                continue
            if case.id not in want:
                res[case.id] = ["fail", "no expected value from the host (case list differs?)"]
                continue
            try:
                got = op_cases.run_case(ember, case, device)
                ok, msg = op_cases.check_results(case, got, want[case.id])
            except Exception:
                ok, msg = False, traceback.format_exc(limit=4)
            res[case.id] = ["pass" if ok else "fail", msg]

    # Memory growth invalidates nothing: results before and after Pyodide's memory grows.
    import pyodide_js
    growth = {}
    try:
        mem = pyodide_js._module.memory
        x = ember.tensor([[float(i * 3 + j) for j in range(37)] for i in range(29)], device="wasm")
        before = (x.T * 2.0).tolist()
        size0 = mem.buffer.byteLength
        big = bytearray(size0 + (64 << 20))   # forces memory.grow
        size1 = mem.buffer.byteLength
        after = (x.T * 2.0).tolist()
        del big
        growth = {"grew": size1 > size0, "same": before == after, "sizes": [size0, size1]}
    except Exception:
        growth = {"error": traceback.format_exc(limit=4)}
    info = {"version": sys.version, "version_info": list(sys.version_info[:3]),
            "platform": sys.platform, "ember_file": ember.__file__, "boot_ms": _ember_boot_ms,
            "results": results, "wasm": wasm_info, "growth": growth, "devices": ember.devices()}
    json.dump(info, open("/io/results.json", "w"))
''')


def _wheel(tmp_factory) -> Path:
    """The site's wheel when build.py built one, else a fresh one from a copy of this tree
    (building in place would leave build/ and egg-info behind, racing other builds)."""
    site = os.environ.get("EMBER_SITE")
    if site:
        found = glob.glob(os.path.join(site, "wheels", "ember-*-py3-none-any.whl"))
        if found:
            return Path(found[0])
    src = tmp_factory.mktemp("src")
    skip = shutil.ignore_patterns("node_modules", "__pycache__", "*.pyc", "*.egg-info")
    for name in ("core", "webgpu", "wasm", "web"):
        shutil.copytree(REPO / name, src / name, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        if (REPO / name).exists():
            shutil.copy2(REPO / name, src / name)
    out = tmp_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                           "--no-build-isolation", "-w", str(out), str(src)],
                          capture_output=True, text=True, cwd=src)
    if proc.returncode != 0:
        pytest.fail(f"building the wheel failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}",
                    pytrace=False)
    (whl,) = out.glob("ember-*-py3-none-any.whl")
    return whl


def need_node() -> str:
    """Node.js's path; skips the test without Node or without the npm Pyodide."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed (needed to run Pyodide outside the browser)")
    if not (PYODIDE_DIR / "pyodide.asm.wasm").is_file():
        pytest.skip("the npm Pyodide is missing from wasm/node_modules: run 'python build.py setup'")
    return node


def run_driver(node: str, wheel: Path, io: Path, driver: str, mounts: dict) -> subprocess.CompletedProcess:
    """Run ``driver`` (Python source, saved as io/driver.py) in Pyodide under Node with the
    ``wheel`` installed and ``mounts`` ({host folder: folder in Pyodide}) mounted."""
    (io / "driver.py").write_text(driver)
    cmd = [node, str(RUNNER), "--wheel", str(wheel)]
    for host, there in mounts.items():
        cmd += ["--mount", f"{host}:{there}"]
    return subprocess.run(cmd + [str(io / "driver.py")], capture_output=True, text=True, timeout=NODE_TIMEOUT_S)


@pytest.fixture(scope="module")
def pyodide_run(tmp_path_factory):
    node = need_node()
    wheel = _wheel(tmp_path_factory)
    io = tmp_path_factory.mktemp("pyodide-io")
    cases = op_cases.all_cases()
    want, host_errors = {}, {}
    for case in cases:
        try:
            want[case.id] = op_cases.expected(np, case)
        except Exception as e:  # a broken case is a failure, reported with its id below
            host_errors[case.id] = f"numpy reference failed: {type(e).__name__}: {e}"
    (io / "expected.json").write_text(json.dumps(want))
    proc = run_driver(node, wheel, io, DRIVER, {REPO / "tests": "/repo/tests", io: "/io"})
    if proc.returncode != 0 or not (io / "results.json").exists():
        pytest.fail(f"Pyodide run failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}",
                    pytrace=False)
    info = json.loads((io / "results.json").read_text())
    info["host_errors"] = host_errors
    info["case_ids"] = [c.id for c in cases]
    return info


def test_pyodide_is_python_314_with_the_wheel(pyodide_run):
    assert pyodide_run["platform"] == "emscripten"
    assert pyodide_run["version_info"][:2] == [3, 14], pyodide_run["version"]
    # ember came from the installed wheel, not from the mounted source tree
    assert "site-packages/ember/" in pyodide_run["ember_file"], pyodide_run["ember_file"]


@pytest.mark.parametrize("device", ["python", "wasm"])
def test_op_cases_pass_in_pyodide(pyodide_run, device):
    if device == "wasm":
        assert "error" not in (pyodide_run["wasm"] or {}), pyodide_run["wasm"]
        assert pyodide_run["wasm"]["runtime"] == "pyodide"
    results = pyodide_run["results"][device]
    ids = pyodide_run["case_ids"]
    assert ids, "no op cases found"
    assert set(results) == set(ids), f"cases not run in Pyodide: {sorted(set(ids) - set(results))[:20]}"
    failures = [msg if msg.startswith(cid) else f"{cid}: {msg}"
                for cid, (status, msg) in results.items() if status == "fail"]
    failures += [f"{cid}: {msg}" for cid, msg in pyodide_run["host_errors"].items()]
    passed = sum(1 for s, _ in results.values() if s == "pass")
    skipped = sum(1 for s, _ in results.values() if s == "skip")
    print(f"pyodide [{device}]: {passed} passed, {skipped} skipped, {len(failures)} failed of {len(ids)} "
          f"(boot {pyodide_run['boot_ms'] / 1000:.1f} s)")
    assert not failures, f"{len(failures)} of {len(ids)} op cases fail inside Pyodide on {device}:\n" + \
        "\n".join(failures[:50]) + ("\n..." if len(failures) > 50 else "")


def test_wasm_is_listed_and_survives_memory_growth(pyodide_run):
    assert "wasm" in pyodide_run["devices"], pyodide_run["devices"]
    g = pyodide_run["growth"]
    assert "error" not in g, g
    assert g["grew"], f"Pyodide's memory did not grow: {g}"
    assert g["same"], "wasm results changed after Pyodide's memory grew"
