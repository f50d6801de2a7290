"""tests/bench/bench_core.py's command line: --help prints the options and runs nothing, bad
options are refused with argparse's usage error (exit status 2) before any benchmark starts."""
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "bench", "bench_core.py")


def _run(*args):
    return subprocess.run([sys.executable, BENCH, *args], capture_output=True, text=True, timeout=60)


def test_help_prints_the_options_and_runs_nothing():
    r = _run("--help")
    assert r.returncode == 0, r.stderr
    for flag in ("--only", "--threads", "--quick", "--torch-python"):
        assert flag in r.stdout
    assert "median wall time" not in r.stdout       # main() never started


@pytest.mark.parametrize("args,word", [(("--only", "bogus"), "invalid choice"), (("--threads", "0"), "--threads"),
                                       (("--threads", "two"), "invalid int"), (("--frobnicate",), "unrecognized")])
def test_bad_options_are_refused(args, word):
    r = _run(*args)
    assert r.returncode == 2 and word in r.stderr, (r.returncode, r.stderr)
    assert "median wall time" not in r.stdout
