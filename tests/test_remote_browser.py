"""ember.remote from Pyodide in headless Chromium: the page's Python connects to an ember serve
child process through the browser's WebSocket (replies awaited with JSPI, ``run_sync``), runs
ops and a compiled plan there and gets the numpy device's results; a wrong token is an
AuthError in the page too."""
import json
import secrets

import pytest

from browser_page import SKIPS, run_page

pytestmark = SKIPS
pytest.importorskip("uvicorn")
pytest.importorskip("websockets")

CODE = """
import json
import ember, ember.remote

dev = ember.remote.connect(URL, token=TOKEN)
x = ember.tensor([[1.0, 2.0], [3.0, 4.0]], device=dev)
y = (x @ x).softmax(-1).tolist()
f = ember.compile(lambda a: ember.relu(a @ x - 5.0).sum(axis=-1))
r = [f(x).tolist() for _ in range(3)]
try:
    ember.remote.connect(URL, token="wrong", name="bad")
    auth = "accepted"
except ember.remote.AuthError as e:
    auth = type(e).__name__
info = ember.remote.info(dev)
dev2 = await ember.remote.connect_async(URL, token=TOKEN, name="a")   # no JSPI needed on this path
v = await (ember.ones((3,), device=dev2) * 2).data_async()
json.dumps({"y": y, "r": r, "auth": auth, "replays": f.stats()["replays"], "server": info["device"],
            "round_trips": info["round_trips"], "async": v})
"""


def test_page_python_runs_on_a_remote_server(tmp_path):
    import ember
    from ember.remote.server import spawn

    token = secrets.token_hex(16)
    proc, url = spawn("numpy", token=token)
    try:
        code = f"URL = {url!r}\nTOKEN = {token!r}\n" + CODE
        res = run_page(tmp_path, code, timeout_ms=300_000)
    finally:
        proc.terminate()
        proc.wait(10)
    x = ember.tensor([[1.0, 2.0], [3.0, 4.0]], device="numpy")
    assert res["y"] == (x @ x).softmax(-1).tolist()
    assert res["r"] == [ember.relu(x @ x - 5.0).sum(axis=-1).tolist()] * 3
    assert res["async"] == [2.0, 2.0, 2.0]
    assert res["auth"] == "AuthError" and res["replays"] == 2 and res["server"] == "numpy", json.dumps(res)
