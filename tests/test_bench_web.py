"""Smoke test of the in-page benchmark (tests/bench/bench_web.py --quick): it runs end to end in
headless Chromium, and ember's outputs agree with onnxruntime-web's on the MNIST CNN.

About 20-40 s: one Pyodide boot per ember backend, one MNIST inference each. Uses the site that
build.py built ($EMBER_SITE) when there is one; installs onnxruntime-web (npm) when missing.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "tests" / "bench" / "bench_web.py"
ORT = REPO / "tests" / "bench" / "web" / "node_modules" / "onnxruntime-web" / "package.json"
CHROMIUM = os.environ.get("EMBER_CHROMIUM", "/usr/bin/chromium")


def test_bench_web_quick(tmp_path):
    pytest.importorskip("playwright")
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM}")
    if not ORT.is_file() and not shutil.which("npm"):
        pytest.skip("onnxruntime-web is not installed and there is no npm to install it")
    if not (REPO / "wasm" / "node_modules" / "pyodide" / "pyodide.asm.wasm").is_file():
        pytest.skip("the npm Pyodide is missing: run 'python build.py setup'")
    raw = tmp_path / "raw.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--quick", "--out", str(tmp_path), "--json", str(raw),
                           "--timeout", "120"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, f"bench_web.py --quick failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert (tmp_path / "results.md").is_file() and (tmp_path / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    results = json.loads(raw.read_text())["results"]
    ref = results["ort-wasm-1t/mnist"]
    assert ref["status"] == "ok", ref
    ref_out = ref["workloads"]["mnist"]["output"]
    assert len(ref_out) == 10
    # ember python must run; ember wasm runs or says why not (until that backend lands).
    assert results["ember-python/mnist"]["status"] == "ok", results["ember-python/mnist"]
    assert results["ember-wasm/mnist"]["status"] in ("ok", "n/a"), results["ember-wasm/mnist"]
    for key in ("ember-python/mnist", "ember-wasm/mnist"):
        r = results[key]
        if r["status"] != "ok":
            assert r["reason"], r
            continue
        out = r["workloads"]["mnist"]["output"]
        assert max(abs(a - b) for a, b in zip(out, ref_out)) < 1e-4, (key, out, ref_out)
        assert r["cold_ms"] > 0 and r["workloads"]["mnist"]["median_ms"] > 0
    assert "| MNIST CNN, batch 1 | onnxruntime-web wasm, 1 thread |" in (tmp_path / "results.md").read_text()
