"""demos/chat/prepare.py: the pure-Python markupsafe wheel it packs from the sdist (reproducible,
no C code, a valid RECORD) and jinja2 + that wheel inside Pyodide under Node (markupsafe falls
back to its pure-Python escape; a chat template renders in jinja2's sandbox). Uses the files in
.cache/ that prepare.py fetched; skips when they are not there (no download in the tests)."""
from __future__ import annotations

import base64
import glob
import hashlib
import importlib.util
import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYODIDE_DIR = REPO / "wasm" / "node_modules" / "pyodide"


def _prepare():
    spec = importlib.util.spec_from_file_location("chat_prepare", REPO / "demos" / "chat" / "prepare.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def prep():
    return _prepare()


@pytest.fixture(scope="module")
def sdist(prep):
    name, version = prep.MARKUPSAFE
    found = glob.glob(str(prep.CACHE / f"{name}-{version}.tar.gz"))
    if not found:
        pytest.skip(f"no {name}-{version}.tar.gz in {prep.CACHE}: run demos/chat/prepare.py")
    return Path(found[0])


def test_markupsafe_wheel_is_pure_python_and_reproducible(prep, sdist, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    wa, wb = prep.markupsafe_wheel(sdist, a), prep.markupsafe_wheel(sdist, b)
    assert wa.name == f"markupsafe-{prep.MARKUPSAFE[1]}-py3-none-any.whl"
    assert wa.read_bytes() == wb.read_bytes()          # same bytes every time: a stable URL hash
    with zipfile.ZipFile(wa) as z:
        names = z.namelist()
        assert "markupsafe/__init__.py" in names and "markupsafe/_native.py" in names
        assert not [n for n in names if n.endswith((".c", ".so", ".pyd"))], names
        info = f"markupsafe-{prep.MARKUPSAFE[1]}.dist-info"
        assert "Tag: py3-none-any" in z.read(f"{info}/WHEEL").decode()
        assert "Root-Is-Purelib: true" in z.read(f"{info}/WHEEL").decode()
        for line in z.read(f"{info}/RECORD").decode().splitlines():
            name, digest, size = line.split(",")
            if name == f"{info}/RECORD":
                continue
            data = z.read(name)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == f"sha256={want}" and int(size) == len(data), name


NODE_SCRIPT = r"""
const { createRequire } = require("module");
const fs = require("fs");
const req = createRequire(process.argv[2] + "/package.json");
(async () => {
  const { loadPyodide } = req("pyodide");
  const py = await loadPyodide({ packages: [] });
  const sp = py.runPython("import site; site.getsitepackages()[0]");
  for (const w of process.argv.slice(3)) py.unpackArchive(new Uint8Array(fs.readFileSync(w)), "wheel", { extractDir: sp });
  console.log(py.runPython(`
import importlib, json, sys
importlib.invalidate_caches()
import markupsafe, jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
t = env.from_string("{% for m in messages %}<|im_start|>{{ m['role'] }}\\n{{ m['content'] }}<|im_end|>\\n{% endfor %}")
json.dumps({"render": t.render(messages=[{"role": "user", "content": "1 < 2 & 3"}]),
            "escape": str(markupsafe.escape("<a href='x'>&")),
            "speedups": "markupsafe._speedups" in sys.modules,
            "escape_impl": markupsafe._escape_inner.__module__, "jinja2": jinja2.__version__})
`));
})().catch((e) => { console.error(e); process.exit(1); });
"""


def test_jinja2_and_markupsafe_run_in_pyodide(prep, sdist, tmp_path):
    node = shutil.which("node")
    if not node or not (PYODIDE_DIR / "pyodide.asm.wasm").is_file():
        pytest.skip("needs Node.js 20+ and the npm Pyodide (python build.py setup)")
    name, version = prep.JINJA2
    jinja = glob.glob(str(prep.CACHE / f"{name}-{version}-py3-none-any.whl"))
    if not jinja:
        pytest.skip(f"no {name}-{version} wheel in {prep.CACHE}: run demos/chat/prepare.py")
    ms = prep.markupsafe_wheel(sdist, tmp_path)
    script = tmp_path / "run.cjs"
    script.write_text(NODE_SCRIPT)
    r = subprocess.run([node, str(script), str(PYODIDE_DIR.parent.parent), jinja[0], str(ms)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["render"] == "<|im_start|>user\n1 < 2 & 3<|im_end|>\n"     # no HTML escaping
    assert got["escape"] == "&lt;a href=&#39;x&#39;&gt;&amp;"
    assert got["speedups"] is False and got["escape_impl"] == "markupsafe._native"
    assert got["jinja2"] == version
