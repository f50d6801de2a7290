#!/usr/bin/env python3
"""Put the PP-OCRv4 model files in place for the OCR page and the tests (host side, stdlib only).

    python demos/ocr/prepare.py     # -> demos/ocr/{ch_PP-OCRv4_det_infer,ch_ppocr_mobile_v2.0_cls_infer,
                                    #    ch_PP-OCRv4_rec_infer}.onnx, config.yaml, LICENSE-models.md

The three ONNX files (PaddleOCR's PP-OCRv4 detector and recogniser and the mobile v2.0 text
direction classifier, Apache-2.0) and the pipeline settings (``config.yaml``) are taken from the
PyPI wheel ``rapidocr-onnxruntime`` 1.4.4. Only those files are used, never the package's code:
the wheel is fetched with ``pip download --no-deps`` (its dependencies would pull in OpenCV)
into ``.cache/`` at the repository root. ``LICENSE-models.md`` (the attribution the page links
to, with the Apache-2.0 notice) is written beside them.

Idempotent: files already present with the expected size are kept. ``python build.py demo|test``
run this before building the site; the model files are gitignored.
"""
from __future__ import annotations

import os
import sys
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PACKAGE, VERSION = "rapidocr-onnxruntime", "1.4.4"
CACHE = Path(os.environ.get("EMBER_CACHE", REPO / ".cache"))
# member of the wheel -> (file written here, size in bytes)
FILES = {
    "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx": ("ch_PP-OCRv4_det_infer.onnx", 4745517),
    "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx": ("ch_ppocr_mobile_v2.0_cls_infer.onnx", 585532),
    "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx": ("ch_PP-OCRv4_rec_infer.onnx", 10857958),
    "rapidocr_onnxruntime/config.yaml": ("config.yaml", 1221),
}
LICENSE = HERE / "LICENSE-models.md"
LICENSE_TEXT = f"""# The OCR page's models

The page runs three models of PaddleOCR (https://github.com/PaddlePaddle/PaddleOCR), in the
ONNX form shipped by RapidOCR (https://github.com/RapidAI/RapidOCR) in the PyPI wheel
`{PACKAGE}` {VERSION}; the settings in `config.yaml` come from the same wheel:

| file | model | task |
|---|---|---|
| `ch_PP-OCRv4_det_infer.onnx` | PP-OCRv4 DBNet detector | where the text is (a probability map) |
| `ch_ppocr_mobile_v2.0_cls_infer.onnx` | PP-OCR mobile v2.0 classifier | is a text line upside down |
| `ch_PP-OCRv4_rec_infer.onnx` | PP-OCRv4 SVTR recogniser (Chinese and English) | the characters of a line |

Copyright (c) PaddlePaddle Authors and RapidAI contributors. Licensed under the Apache License,
Version 2.0 (the "License"); you may not use these files except in compliance with the
License. You may obtain a copy of the License at http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software distributed under the
License is distributed on an "AS IS" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either
express or implied. See the License for the specific language governing permissions and
limitations under the License.

The files are used unchanged. ember's own code (the pipeline around them, `demos/ocr/*.py`) is
not derived from PaddleOCR's or RapidOCR's code.
"""

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import pypi_files  # noqa: E402  (demos/pypi_files.py: the download and extraction every prepare.py shares)


def log(msg: str) -> None:
    print(f"[ocr] {msg}", flush=True)


def _current() -> bool:
    return all((HERE / name).is_file() and (HERE / name).stat().st_size == size
               for name, size in FILES.values()) and LICENSE.is_file()


def _wheel(python: str = sys.executable) -> Path:
    """The package's wheel in the cache, downloaded (without its dependencies) when missing."""
    return pypi_files.wheel(f"{PACKAGE}=={VERSION}", f"rapidocr_onnxruntime-{VERSION}-*.whl",
                            "15 MB wheel, only its model files are used; the OCR models come from it",
                            log=log, python=python, cache=CACHE)


def prepare(python: str = sys.executable) -> Path:
    """Extract the model files and config.yaml into demos/ocr/ unless they are there already."""
    if _current():
        return HERE
    t0 = time.time()
    whl = _wheel(python)
    try:
        with zipfile.ZipFile(whl) as z:
            for member, (name, size) in FILES.items():
                data = z.read(member)
                if len(data) != size:
                    raise SystemExit(f"prepare: {member} in {whl.name} has {len(data)} bytes, expected {size}")
                tmp = HERE / (name + ".part")
                tmp.write_bytes(data)
                os.replace(tmp, HERE / name)
    except (zipfile.BadZipFile, KeyError) as e:
        raise SystemExit(f"prepare: {whl} is not the expected wheel ({e}); delete it and run again") from None
    LICENSE.write_text(LICENSE_TEXT, encoding="utf-8")
    log(f"wrote {len(FILES)} files from {whl.name} into demos/ocr/ in {time.time() - t0:.1f} s")
    return HERE


if __name__ == "__main__":
    prepare()
