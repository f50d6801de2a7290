"""Fuzzer findings against ember.onnx, all fixed (issue 12): each reproducer in
tests/fuzz/onnx_findings/ now fails with an ember error naming the node or initializer, never a
bare IndexError/ValueError/TypeError, a hang or a memory blow-up. Replayed through the fuzz
harness itself (a child process under a memory cap and a timeout)."""
import glob
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FINDINGS = os.path.join(REPO, "tests", "fuzz", "onnx_findings")
# Loops with a 10**12 (or no) trip count: refused by the call's Loop/Scan budget after its 5,000
# iterations (about a second on the python device; a busy CI machine may take longer).
LOOPS = {
    "timeout-run_core_onnx_functional.py_77__flat_values_.onnx",     # no trip count, constant-true cond
    "timeout-run_core_onnx_ops.py_1290__loop_.onnx",                  # trip count 1.1e12
    "timeout-run_core_onnx_runtime.py_125__run_graph_.onnx",          # 61,443 iterations of one Add
}
ALL = sorted(os.path.basename(p) for p in glob.glob(os.path.join(FINDINGS, "*.onnx")))


@pytest.fixture(scope="module")
def replayed() -> dict:
    """{file name: the harness's line for it}: every reproducer replayed by one ``fuzz.py
    --replay`` (each still in its own forked child under the memory cap and the timeout)."""
    paths = [os.path.join(FINDINGS, n) for n in ALL]
    proc = subprocess.run([sys.executable, os.path.join(REPO, "tests", "fuzz", "fuzz.py"), "--replay", *paths],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    lines = {}
    for line in proc.stdout.splitlines():
        path, sep, rest = line.partition(": ")
        if sep and os.path.basename(path) in ALL:
            lines[os.path.basename(path)] = rest
    assert set(lines) == set(ALL), (proc.stdout + proc.stderr)[-4000:]
    return lines


def test_every_finding_is_listed():
    assert len(ALL) >= 15 and LOOPS <= set(ALL)


@pytest.mark.parametrize("name", [n for n in ALL if n not in LOOPS])
def test_fixed_finding_gives_an_ember_error(replayed, name):
    out = replayed[name]
    assert out.startswith("fine (ember"), out


@pytest.mark.parametrize("name", sorted(LOOPS))
def test_endless_loops_are_refused_by_the_iteration_budget(replayed, name):
    out = replayed[name]
    assert "(ember OnnxError" in out and "Loop/Scan iterations" in out, out
