"""The whole op-case list on device "wasm" in headless Chromium: Pyodide on the page's main
thread, the SIMD module compiled asynchronously by ``await ember.wasm.init()`` (what a page
should do; Chromium 156 also allows this small module to compile synchronously there) and
instantiated on Pyodide's memory. Expected values
come from numpy on the host, as in tests/test_pyodide.py. Stands alone like
tests/test_webgpu_browser.py: a plain ``http.server`` on 127.0.0.1 serves the wheel, the npm
Pyodide, the case files and one page."""
from __future__ import annotations

import json
import os

import pytest

np = pytest.importorskip("numpy")

import op_cases  # noqa: E402

from browser_page import SKIPS, run_page  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = SKIPS

PAGE_CODE = r'''
import json, sys, traceback
import ember
sys.path.insert(0, "/repo/tests")
import op_cases

out = {}
out["init"] = await ember.wasm.init()
out["devices"] = ember.devices()
want = json.load(open("/repo/expected.json"))
res = out["results"] = {}
for case in op_cases.all_cases():
    if "wasm" in case.skip:
        res[case.id] = ["skip", case.skip["wasm"]]
        continue
    try:
        got = op_cases.run_case(ember, case, "wasm")
        ok, msg = op_cases.check_results(case, got, want[case.id])
    except Exception:
        ok, msg = False, traceback.format_exc(limit=4)
    res[case.id] = ["pass" if ok else "fail", msg]
json.dumps(out)
'''

@pytest.fixture(scope="module")
def page_result(tmp_path_factory):
    d = tmp_path_factory.mktemp("ember-wasm-site")
    want = {c.id: op_cases.expected(np, c) for c in op_cases.all_cases()}
    (d / "expected.json").write_text(json.dumps(want))
    return run_page(d, PAGE_CODE, links={"tests": os.path.join(ROOT, "tests")},
                    files=["tests/op_cases.py", "tests/op_cases_nn.py", "tests/op_cases_array_api.py",
                           "tests/golden/nn_ops.safetensors",
                           "expected.json"])


def test_async_init_on_the_main_thread(page_result):
    assert page_result["init"]["runtime"] == "pyodide"
    assert "wasm" in page_result["devices"]


def test_without_isolation_one_thread_and_a_note(page_result):
    """This page has no COOP/COEP headers: no SharedArrayBuffer, so the wasm thread team cannot
    exist; everything runs on one thread (the op cases below still pass) and info says why."""
    init = page_result["init"]
    assert init["threads"] == 1 and init["shared_memory"] is False, init
    assert "cross-origin isolated" in init["note"], init


def test_op_cases_pass_on_wasm_in_chromium(page_result):
    results = page_result["results"]
    ids = [c.id for c in op_cases.all_cases()]
    assert set(results) == set(ids)
    failures = [f"{cid}: {msg}" for cid, (status, msg) in results.items() if status == "fail"]
    passed = sum(1 for s, _ in results.values() if s == "pass")
    print(f"chromium [wasm]: {passed} passed, {len(ids) - passed - len(failures)} skipped, "
          f"{len(failures)} failed of {len(ids)}")
    assert not failures, f"{len(failures)} of {len(ids)} op cases fail on wasm in Chromium:\n" + \
        "\n".join(failures[:50])
