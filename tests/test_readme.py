"""The README's Python runs as written: every fenced ``python`` block that starts with
``import ember`` (the self-contained ones; the others continue an earlier example or need a file
of yours) runs in a fresh interpreter in an empty folder, and the Python inside the Pyodide
snippet falls back to the CPU when WebGPU does not start."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
BLOCKS = re.findall(r"^```python\n(.*?)^```", README, re.S | re.M)
SELF_CONTAINED = [b for b in BLOCKS if b.startswith("import ember")]


def _run(code: str, cwd, env=None):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd,
                          timeout=300, env={**os.environ, **(env or {})})


def test_readme_has_runnable_blocks():
    assert len(SELF_CONTAINED) >= 3, [b.splitlines()[:2] for b in BLOCKS]
    mlp = next(b for b in SELF_CONTAINED if "class MLP" in b)
    assert 'ember.save_safetensors(model.state_dict(), "mlp.safetensors")' in mlp
    assert "pip install wgpu" in README


@pytest.mark.parametrize("i", range(len(SELF_CONTAINED)),
                         ids=[b.splitlines()[2 if len(b.splitlines()) > 2 else 0][:30] for b in SELF_CONTAINED])
def test_readme_block_runs(i, tmp_path):
    r = _run(SELF_CONTAINED[i], tmp_path)
    assert r.returncode == 0, f"README block {i}:\n{SELF_CONTAINED[i]}\n{r.stderr[-3000:]}"


def _pyodide_snippet() -> str:
    m = re.search(r"runPythonAsync\(`\n(.*?)`\)", README, re.S)
    assert m, "the Pyodide snippet is gone"
    return m.group(1)


def test_pyodide_snippet_falls_back_without_webgpu(tmp_path):
    """No WebGPU (here: wgpu-py hidden): the snippet says so and answers on the CPU, no traceback.
    Run natively with top-level await, as runPythonAsync runs it."""
    body = _pyodide_snippet()
    assert "except" in body
    code = textwrap.dedent(f"""
        import ast, asyncio, sys, types
        sys.modules["wgpu"] = None            # as in a browser without navigator.gpu
        src = {body!r}
        tree = ast.parse(src)
        last = tree.body.pop()                 # runPythonAsync returns the last expression
        ns = {{}}
        async def main():
            exec_ = compile(ast.Module(tree.body, []), "<readme>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            r = eval(exec_, ns)
            if r is not None:
                await r
            print("RESULT", eval(compile(ast.Expression(last.value), "<readme>", "eval"), ns))
            print("DEVICE", ns["device"])
        asyncio.run(main())
    """)
    r = _run(code, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "WebGPU unavailable" in r.stdout
    assert "RESULT [[8.0, 11.0], [16.0, 23.0]]" in r.stdout
    assert "DEVICE wasm" in r.stdout
