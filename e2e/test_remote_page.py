"""The MiniLM and chat pages with a server (``build.py demo --remote URL``): the site's remote.json
names an ember serve process (numpy, a child of this test); the pages offer "Server GPU (numpy at
ws://…)" next to their own backends; MiniLM's embeddings computed there match PyTorch's, the
chat's greedy reply equals the page CPU's."""
from __future__ import annotations

import json
import math
import secrets
from pathlib import Path

import pytest

pytest.importorskip("websockets")
GOLDEN = json.loads((Path(__file__).resolve().parent.parent / "demos" / "minilm" / "golden_embeddings.json")
                    .read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def remote_site(site_dir):
    from ember.remote.server import spawn

    token = secrets.token_hex(16)
    proc, url = spawn("numpy", token=token)
    cfg = site_dir / "remote.json"
    old = cfg.read_text() if cfg.is_file() else None
    cfg.write_text(json.dumps({"url": url, "token": token}))
    yield url
    if old is None:
        cfg.unlink()
    else:
        cfg.write_text(old)
    proc.terminate()
    proc.wait(10)


def _cos(a, b):
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_minilm_page_runs_on_the_server(page, remote_site, site_dir):
    if not (site_dir / "demos" / "minilm" / "minilm-l6-v2.f16.safetensors").is_file():
        pytest.skip("the site has no MiniLM weights: demos/minilm/prepare.py could not fetch them")
    page.goto("/demos/minilm/")
    got = page.evaluate("""async () => {
        await window.emberDemo.ready;
        const s = await window.emberDemo.serverReady;
        if (!s.ok) return {error: s.error};
        const r = await window.emberDemo.embed([TEXTS[0], TEXTS[1]], "server");
        window.emberDemo.setBackend("server");
        return {embeddings: r.embeddings, device: r.device, backend: r.backend, info: s.info,
                label: document.getElementById("backend-name").textContent,
                choice: document.getElementById("server-label").textContent};
    }""".replace("TEXTS", json.dumps(GOLDEN["texts"])))
    assert "error" not in got, got
    assert got["backend"] == "server" and got["device"] == "remote" and got["info"]["server_device"] == "numpy"
    assert got["label"] == got["choice"] == f"Server GPU (numpy at {remote_site})"
    for row, want in zip(got["embeddings"], GOLDEN["f16w"][:2]):
        assert _cos(row, want) > 0.9999


def test_chat_page_runs_on_the_server(page, remote_site, site_dir):
    if not (site_dir / "demos" / "chat" / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file():
        pytest.skip("the site has no chat model: demos/chat/prepare.py could not fetch it")
    page.goto("/demos/chat/")
    got = page.evaluate("""async () => {
        await window.emberDemo.ready;
        const named = await window.emberDemo.serverChecked;
        if (!named.ok) return {error: named.error};
        const s = await window.emberDemo.startServer();
        const opts = {maxTokens: 8, temperature: 0};
        const server = await window.emberDemo.generate("The capital of France is", {...opts, backend: "server"});
        const cpu = await window.emberDemo.generate("The capital of France is", {...opts, backend: "cpu"});
        window.emberDemo.setBackend("server");
        return {server: server.text, cpu: cpu.text, device: server.device, info: s,
                label: document.getElementById("backend-name").textContent};
    }""")
    assert "error" not in got, got
    assert got["info"]["server_device"] == "numpy" and got["device"].startswith("remote")
    assert got["server"] == got["cpu"] and got["server"].strip(), got   # greedy: the same tokens as the page's CPU
    assert got["label"] == f"Server GPU (numpy at {remote_site})"
