"""build.py as a new user meets it: --help is instant and installs nothing; a busy port is
reported before any set-up, with a port that is really free; the PID `build.py demo` prints
under is the server's own (stopping it stops serving)."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = ["demo", "test", "bench", "onnx-report", "wheel", "site", "setup"]


@pytest.fixture
def bare(tmp_path):
    """build.py alone in an empty folder: anything it installed would show up there."""
    shutil.copy(os.path.join(REPO, "build.py"), tmp_path / "build.py")
    return tmp_path


@pytest.mark.parametrize("cmd", COMMANDS)
def test_help_is_instant_and_installs_nothing(bare, cmd):
    t0 = time.time()
    proc = subprocess.run([sys.executable, "build.py", cmd, "--help"], cwd=bare, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f"build.py {cmd}" in proc.stdout
    assert "--site" not in proc.stdout
    assert time.time() - t0 < 10
    assert sorted(os.listdir(bare)) == ["build.py"], os.listdir(bare)


def test_busy_port_is_reported_first_with_a_free_alternative(bare):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        proc = subprocess.run([sys.executable, "build.py", "demo", "--port", str(port)], cwd=bare,
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    msg = proc.stderr
    assert f"127.0.0.1:{port}" in msg and "--port" in msg, msg
    assert sorted(os.listdir(bare)) == ["build.py"]
    alt = int(msg.rsplit("--port ", 1)[1].split()[0])
    with socket.socket() as s:   # the suggested port really is free
        s.bind(("127.0.0.1", alt))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not os.path.exists(os.path.join(REPO, ".venv", "bin", "python")),
                    reason="needs the project's .venv (python build.py setup)")
def test_killing_the_demo_pid_stops_the_server():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "build.py", "demo", "--port", str(port)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 600
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/manifest.json", timeout=2) as r:
                    assert r.status == 200
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"build.py demo exited: {proc.stdout.read()[-3000:]}")
                time.sleep(0.5)
        else:
            pytest.fail("the demo server never answered")
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        time.sleep(0.5)
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/manifest.json", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
