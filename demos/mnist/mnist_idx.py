"""Read the original MNIST files (gzip'd IDX) and the committed ``testdigits.json``, pure Python.

IDX is MNIST's container: two zero bytes, a type code (0x08 = unsigned byte), the number of
dimensions, one big-endian uint32 per dimension, then the row-major payload.

>>> import gzip, io, struct
>>> raw = struct.pack(">HBB2I", 0, 8, 2, 2, 3) + bytes(range(6))
>>> dims, payload = parse_idx(raw, "example")
>>> dims, list(payload)
((2, 3), [0, 1, 2, 3, 4, 5])
"""
from __future__ import annotations

import gzip
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
TESTDIGITS = os.path.join(HERE, "testdigits.json")


def parse_idx(raw: bytes, what: str = "IDX data") -> tuple[tuple, bytes]:
    """(dims, payload bytes) of an unsigned-byte IDX file; ValueError says what is wrong."""
    if len(raw) < 4:
        raise ValueError(f"{what}: {len(raw)} bytes is too short for an IDX header")
    zero, code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or code != 0x08 or not 1 <= ndim <= 4:
        raise ValueError(f"{what}: not an unsigned-byte IDX file (magic {raw[:4].hex()})")
    head = 4 + 4 * ndim
    if len(raw) < head:
        raise ValueError(f"{what}: truncated header ({len(raw)} bytes, need {head})")
    dims = struct.unpack(f">{ndim}I", raw[4:head])
    n = 1
    for d in dims:
        n *= d
    if len(raw) - head != n:
        raise ValueError(f"{what}: {len(raw) - head} payload bytes for dims {dims} (need {n})")
    return dims, raw[head:]


def find_idx(data_dir: str, stem: str) -> str:
    """Path of e.g. ``t10k-images`` in ``data_dir`` (``-idx3-ubyte.gz`` or ``.idx3-ubyte.gz``)."""
    kind = "idx3-ubyte" if "images" in stem else "idx1-ubyte"
    for sep in (".", "-"):  # both spellings of the original file names are in circulation
        p = os.path.join(data_dir, f"{stem}{sep}{kind}.gz")
        if os.path.exists(p):
            return p
    raise FileNotFoundError(f"no {stem}-{kind}.gz (or {stem}.{kind}.gz) in {data_dir!r}: "
                            f"pass --data with the four MNIST IDX files")


def read_split(data_dir: str, split: str = "test") -> tuple[list[bytes], list[int]]:
    """(images, labels) of the ``train`` or ``test`` split: 784 bytes per image (0..255)."""
    prefix = {"train": "train", "test": "t10k"}[split]
    paths = [find_idx(data_dir, f"{prefix}-images"), find_idx(data_dir, f"{prefix}-labels")]
    (idims, pix), (ldims, lab) = [parse_idx(gzip.open(p, "rb").read(), p) for p in paths]
    if len(idims) != 3 or idims[1:] != (28, 28) or ldims != (idims[0],):
        raise ValueError(f"{split}: images {idims} and labels {ldims} do not match MNIST's layout")
    return [pix[i * 784:(i + 1) * 784] for i in range(idims[0])], list(lab)


def read_testdigits(path: str = TESTDIGITS) -> dict:
    """The committed digits: ``{"images": [784 bytes...], "labels": [...], "golden": {...}}``."""
    with open(path) as f:
        doc = json.load(f)
    doc["images"] = [bytes.fromhex(h) for h in doc["images_hex"]]
    return doc
