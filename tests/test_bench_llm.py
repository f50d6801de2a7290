"""tests/bench/bench_llm.py: its prompts (issue 18's 21-token anchor prompt next to the ~200-token
one), the report's grouping by prompt, and a smoke run of the wllama page on the short prompt
checked against ember's tokenizer and ember's own greedy tokens.

The pure-Python parts take a few seconds; the page smoke test ~20-40 s (Chromium, one wllama
load, the short prompt, 4 new tokens) and needs the SmolLM2 GGUF, Chromium and npm (or an installed
@wllama/wllama).
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "tests" / "bench" / "bench_llm.py"
REAL = REPO / "demos" / "chat" / "SmolLM2-135M-Instruct.Q4_1.gguf"
CHROMIUM = os.environ.get("EMBER_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_llm_under_test", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(bench, engine, config, prompt, decode, prefill, peer=True, file="q4_1"):
    return bench.row("browser", engine, config, file, peer=peer, prompt=prompt, prompt_tokens=21,
                     prompt_tps=prefill, tokens=128, decode_tps=decode, text="x")


def test_ratios_and_goals_compare_the_same_prompt_only(bench):
    rows = [_row(bench, "wllama", "1 thread", "long", 6.0, 9.0),
            _row(bench, "wllama", "2 threads", "long", 9.0, 16.0),
            _row(bench, "wllama", "1 thread", "short", 13.5, 14.0),
            _row(bench, "wllama", "2 threads", "short", 24.0, 21.0),
            _row(bench, "ember", "wasm (cpu)", "long", 30.0, 100.0, peer=False),
            _row(bench, "ember", "wasm (cpu)", "short", 36.0, 42.0, peer=False)]
    got = {it["row"]["prompt"]: it for it in bench.ratios(rows)}
    assert got["long"]["decode_tps"][0] == pytest.approx(30.0 / 9.0)
    assert got["long"]["prompt_tps"][0] == pytest.approx(100.0 / 16.0)
    assert got["short"]["decode_tps"][0] == pytest.approx(36.0 / 24.0)
    assert got["short"]["prompt_tps"][0] == pytest.approx(42.0 / 21.0)
    for r in rows:
        r["loadavg"] = 0.5
    lines = bench.goals(rows)
    assert any("decode (long prompt)" in s and "3.33×" in s and "(met" in s for s in lines), lines
    # the short prompt is also held against issue 18's best anchor (29.7 decode, 32.9 prompt)
    assert any("decode (short prompt)" in s and "1.50×" in s and "not met" in s and "anchor 29.7: 1.21×" in s
               for s in lines), lines
    assert any("prompt (short prompt)" in s and "anchor 32.9: 1.28×" in s for s in lines), lines
    assert not any("NOT a valid claim" in s for s in lines), lines
    rows[1]["loadavg"] = 4.7                               # the best long-prompt peer ran on a busy machine
    lines = bench.goals(rows)
    assert any("decode (long prompt)" in s and "NOT a valid claim: measured at load average 4.7" in s
               for s in lines), lines
    assert not any("short prompt" in s and "NOT a valid" in s for s in lines), lines
    meta = {"date": "d", "command": "c", "machine": "m", "versions": "v", "wall_s": 1.0, "prompt_note": "p",
            "max_tokens": 128, "prompt_tokens": "207 / 21", "notes": [], "commands": []}
    md = bench.table(rows, meta)
    assert "| browser | wllama 1 thread | Q4_1 | short | 21 | 14.0 | 128 | 13.5 |" in md
    assert "| browser | ember wasm (cpu) | Q4_1 | short | 1.50× | wllama 2 threads |" in md


def test_wllama_notes_name_every_load_parameter(bench):
    seen = [{"loadParams": {"n_threads": 1, "n_ctx": 1024, "flash_attn": False}, "multiThread": False,
             "nbThreads": 1, "crossOriginIsolated": True, "context": {"n_batch": 1024}},
            {"loadParams": {"n_threads": 2, "n_ctx": 1024, "flash_attn": False}, "multiThread": True,
             "nbThreads": 2, "crossOriginIsolated": True, "context": {"n_batch": 1024}}]
    first = bench.wllama_notes(seen)[0]
    for want in ("flash_attn = false", "n_ctx = 1024", "n_threads = 1 / 2", "n_threads 2: multi-thread True",
                 "crossOriginIsolated True", '"n_batch": 1024'):
        assert want in first, (want, first)


def test_bad_arguments_are_clear_errors(bench):
    with pytest.raises(SystemExit):
        bench.parse_args(["--prompt", "medium"])
    with pytest.raises(ValueError, match="unknown prompt"):
        bench.make_prompt(None, False, "medium")
    assert bench.parse_args(["--prompt", "both"]).prompt == "both"
    assert bench.parse_args([]).prompt == "long"          # the old command's prompt is unchanged


@pytest.mark.skipif(not REAL.exists(), reason="the SmolLM2 GGUF is fetched by build.py (demos/chat/prepare.py)")
def test_prompt_lengths_match_ember_tokenizer(bench):
    pytest.importorskip("gguf")
    import ember.llm

    model = ember.llm.load(str(REAL), device="numpy")
    vocab = bench.Vocab(REAL)
    short = bench.make_prompt(vocab, False, "short")
    assert len(model.tokenizer.encode(short)) == 21             # issue 18's anchor prompt length
    assert 190 <= len(model.tokenizer.encode(bench.make_prompt(vocab, False, "long"))) <= 230
    assert bench.make_prompt(vocab, True, "short") == bench.SHORT_USER


@pytest.mark.skipif(not REAL.exists(), reason="the SmolLM2 GGUF is fetched by build.py (demos/chat/prepare.py)")
def test_wllama_page_short_prompt_smoke(tmp_path):
    """One wllama load (1 thread, Q4_1) on the short prompt, 4 new tokens: llama.cpp must see the
    prompt length ember's tokenizer gives and make ember's greedy tokens (the long prompt's 207
    tokens would add ~20-40 s here; --prompt both runs it the same way)."""
    pytest.importorskip("playwright")
    pytest.importorskip("gguf")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM}")
    pkg = REPO / "tests" / "bench" / "llm" / "node_modules" / "@wllama" / "wllama" / "package.json"
    if not pkg.is_file() and not shutil.which("npm"):
        pytest.skip("@wllama/wllama is not installed and there is no npm to install it")
    proc = subprocess.run([sys.executable, str(BENCH), "--browser-only", "--devices", "numpy", "--no-wllama-webgpu",
                           "--wllama-threads", "1", "--files", "q4_1", "--prompt", "short", "--max-tokens", "4",
                           "--out", str(tmp_path), "--timeout", "240"],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, f"bench_llm.py failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    rows = json.loads((tmp_path / "results-browser.json").read_text())["rows"]
    got = {r["prompt"]: r for r in rows if r["engine"] == "wllama"}
    assert set(got) == {"short"} and all(r["status"] == "ok" for r in got.values()), got

    import ember.llm

    bench = importlib.util.module_from_spec(spec := importlib.util.spec_from_file_location("b2", BENCH))
    spec.loader.exec_module(bench)
    model = ember.llm.load(str(REAL), device="numpy")
    vocab = bench.Vocab(REAL)
    for name, r in got.items():
        prompt = bench.make_prompt(vocab, False, name)
        assert r["prompt_tokens"] == len(model.tokenizer.encode(prompt)), (name, r["prompt_tokens"])
        assert r["tokens"] == 4 and r["decode_tps"] > 0 and r["prompt_tps"] > 0
        assert r["text"] == model.generate(prompt, max_tokens=4, temperature=0), name
    md = (tmp_path / "results-browser.md").read_text()
    assert "wllama load parameters:" in md and "n_threads 1: multi-thread False" in md
