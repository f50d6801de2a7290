"""The OCR demo (demos/ocr/) natively against the reference pipeline (rapidocr-onnxruntime, a
test-only dependency): settings, dictionary, PNG decoding, geometry, each stage and the whole
pipeline on images rendered with Pillow (several fonts, sizes, colours, slight angles, English
and Chinese), on the numpy and wasm backends. Images are kept small: the detector sizes its input
to 736 px on the short side whatever the image."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parent.parent / "demos" / "ocr"
sys.path.insert(0, str(DEMO))

np = pytest.importorskip("numpy")
PIL = pytest.importorskip("PIL.Image")
rapidocr = pytest.importorskip("rapidocr_onnxruntime")
if not (DEMO / "ch_PP-OCRv4_rec_infer.onnx").is_file():
    pytest.skip("OCR models missing: run python demos/ocr/prepare.py", allow_module_level=True)

import geometry  # noqa: E402
import images  # noqa: E402
import make_samples  # noqa: E402
import pipeline  # noqa: E402

CJK = Path(make_samples.FONTS["cjk"]).is_file()

MIXED = dict(size=(480, 300), lines=[
    {"text": "Invoice 2041", "xy": (30, 20), "font": "bold", "px": 30},
    {"text": "Paid by card", "xy": (30, 80), "font": "serif", "px": 26, "colour": (20, 60, 150), "angle": 3},
    {"text": "Total 18.90", "xy": (260, 150), "font": "mono", "px": 24, "colour": (120, 20, 20)},
    {"text": "谢谢光临", "xy": (40, 210), "font": "cjk" if CJK else "sans", "px": 36},
])


def _pil(spec):
    return make_samples.render(spec["lines"], spec["size"], spec.get("background", (255, 255, 255)))


def _image(pil) -> images.Image:
    return images.Image(pil.width, pil.height, pil.convert("RGB").tobytes())


@pytest.fixture(scope="module")
def reference():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return rapidocr.RapidOCR()


def _ocr(device):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pipeline.OCR.from_folder(str(DEMO), device=device, compile=False)


@pytest.fixture(scope="module")
def ocr_numpy():
    return _ocr("numpy")


def _ref_lines(reference, pil):
    bgr = np.asarray(pil.convert("RGB"))[:, :, ::-1].copy()
    res, _ = reference(bgr)
    return [{"text": t, "score": s, "box": [[float(x), float(y)] for x, y in b]} for b, t, s in (res or [])]


def _iou(a, b):
    """IoU of two quadrilaterals, by rasterising both on a 0.5 px grid (test-side only)."""
    from PIL import Image, ImageDraw
    xs = [p[0] for p in a + b]
    ys = [p[1] for p in a + b]
    x0, y0 = min(xs), min(ys)
    w, h = int((max(xs) - x0) * 2) + 2, int((max(ys) - y0) * 2) + 2
    masks = []
    for q in (a, b):
        m = Image.new("1", (w, h))
        ImageDraw.Draw(m).polygon([((x - x0) * 2, (y - y0) * 2) for x, y in q], fill=1)
        masks.append(np.asarray(m))
    inter = np.logical_and(*masks).sum()
    union = np.logical_or(*masks).sum()
    return inter / union


def _compare(got, want, px=4):
    assert len(got) == len(want), ([g["text"] for g in got], [w["text"] for w in want])
    same = sum(g["text"] == w["text"] for g, w in zip(got, want))
    assert same >= math.ceil(0.95 * len(want)), ([g["text"] for g in got], [w["text"] for w in want])
    for g, w in zip(got, want):
        assert _iou(g["box"], w["box"]) >= 0.7, (g, w)
        assert max(abs(p - q) for pg, pw in zip(g["box"], w["box"]) for p, q in zip(pg, pw)) <= px, (g, w)
        assert abs(g["score"] - w["score"]) < 0.05, (g, w)


# ---- pieces ----------------------------------------------------------------------------------

def test_config_matches_yaml():
    yaml = pytest.importorskip("yaml")
    text = (DEMO / "config.yaml").read_text()
    assert pipeline.parse_config(text) == yaml.safe_load(text)


def test_dictionary_from_onnx_metadata():
    import onnxruntime as ort
    data = (DEMO / pipeline.REC_FILE).read_bytes()
    meta = pipeline.onnx_metadata(data)
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    assert meta == dict(sess.get_modelmeta().custom_metadata_map)
    assert len(meta["character"].splitlines()) == 6623


def test_png_decoder_matches_pillow(tmp_path):
    pil = _pil(MIXED).resize((120, 75))
    for mode in ("RGB", "RGBA", "L", "P", "LA"):
        im = pil.convert(mode)
        if mode == "RGBA":
            im.putalpha(200)
        path = tmp_path / f"x_{mode}.png"
        im.save(path)
        got = images.decode_png(path.read_bytes())
        ref = images._pillow(path.read_bytes())
        diff = max(abs(a - b) for a, b in zip(got.data, ref.data))
        assert (got.width, got.height) == (120, 75) and diff <= 1, mode


@pytest.mark.parametrize("data,words", [
    (b"", "empty"), (b"GIF89a not really", "not a PNG or JPEG"),
    (b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\x0dIHDR", "(?i)truncated"),
])
def test_bad_files(data, words):
    with pytest.raises(images.ImageError, match=words):
        images.decode(data)
    if data.startswith(images.PNG_SIGNATURE):
        with pytest.raises(images.ImageError, match="truncated"):
            images.decode_png(data)


def test_truncated_and_huge_png():
    import struct
    import zlib
    png = images.encode_png(_image(_pil(MIXED).resize((60, 40))))
    with pytest.raises(images.ImageError):
        images.decode_png(png[:len(png) // 2])
    with pytest.raises(images.ImageError):
        images.decode(png[:len(png) // 2])
    ihdr = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    huge = images.PNG_SIGNATURE + struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    with pytest.raises(images.ImageError, match="too large"):
        images.decode_png(huge)


def test_geometry():
    # a rotated rectangle's pixels -> its rectangle back
    pts = []
    a = math.radians(20)
    for u in range(0, 80):
        for v in range(0, 20):
            pts.append((round(100 + u * math.cos(a) - v * math.sin(a)), round(50 + u * math.sin(a) + v * math.cos(a))))
    cx, cy, w, h, ux, uy = geometry.min_area_rect(pts)
    assert sorted([w, h]) == pytest.approx([19, 79], abs=1.5)
    assert abs(abs(math.degrees(math.atan2(uy, ux))) % 90 - 20) < 2 or abs(abs(math.degrees(math.atan2(uy, ux))) % 90 - 70) < 2
    mask = bytes([0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1])
    assert geometry.dilate2x2(mask, 4, 3) == bytes([0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 0, 1])
    comps = geometry.components(bytes([1, 1, 0, 0, 0, 0, 0, 1, 1, 0, 1, 1]), 4, 3)
    assert sorted(sorted(c.items()) for c in comps) == [[(0, [0, 1])], [(1, [3, 3]), (2, [2, 3])], [(2, [0, 0])]]


def test_detector_stage_matches_reference(reference, ocr_numpy):
    pil = _pil(MIXED)
    img = _image(pil)
    bgr = np.asarray(pil)[:, :, ::-1].copy()
    ref_boxes, _ = reference.text_det(bgr)
    ref_boxes = [b.tolist() for b in reference.sorted_boxes(ref_boxes)]
    timings = {s: 0.0 for s in pipeline.STAGES}
    boxes, _ = ocr_numpy.detect(img, timings)
    assert len(boxes) == len(ref_boxes)
    for b, r in zip(boxes, ref_boxes):
        assert max(abs(p - q) for pb, pr in zip(b, r) for p, q in zip(pb, pr)) <= 3, (b, r)


def test_ctc_decode_matches_reference(ocr_numpy):
    from rapidocr_onnxruntime.ch_ppocr_rec.utils import CTCLabelDecode
    chars = pipeline.onnx_metadata((DEMO / pipeline.REC_FILE).read_bytes())["character"].splitlines()
    ref = CTCLabelDecode(character=chars)
    rng = np.random.default_rng(0)
    logits = rng.random((3, 40, len(ocr_numpy.characters))).astype(np.float32) ** 8
    logits[:, ::3, 0] = 5.0                                    # blanks between characters
    preds = logits / logits.sum(axis=2, keepdims=True)
    want = ref(preds)
    for p, (text, score) in zip(preds, want):
        got = ocr_numpy.decode(p.argmax(axis=1).tolist(), p.max(axis=1).tolist())
        assert got[0] == text and got[1] == pytest.approx(score, rel=1e-5)


# ---- the whole pipeline ----------------------------------------------------------------------

def test_pipeline_numpy_matches_reference(reference, ocr_numpy):
    pil = _pil(MIXED)
    got = ocr_numpy.read(_image(pil))["lines"]
    _compare(got, _ref_lines(reference, pil))


def test_pipeline_numpy_samples(reference, ocr_numpy):
    for name in ("chinese.png", "tilted.png"):
        pil = PIL.open(DEMO / "samples" / name)
        got = ocr_numpy.read(images.decode((DEMO / "samples" / name).read_bytes()))["lines"]
        _compare(got, _ref_lines(reference, pil))


def test_upside_down_line_is_turned(reference, ocr_numpy):
    # square: the detector runs at 736 x 736 (360 x 110 would be 2400 x 736)
    pil = make_samples.render([{"text": "Upsidedown", "xy": (40, 30), "px": 34, "angle": 180}], (360, 360))
    got = ocr_numpy.read(_image(pil))["lines"]
    assert [g["text"] for g in got] == ["Upsidedown"]
    _compare(got, _ref_lines(reference, pil))


def test_pipeline_wasm_matches_reference(reference):
    pytest.importorskip("wasmtime")
    import ember
    if "wasm" not in ember.devices():
        pytest.skip("no wasm backend here")
    pil = make_samples.render([
        {"text": "Hello ember", "xy": (20, 15), "font": "bold", "px": 30},
        {"text": "wasm 42", "xy": (30, 70), "font": "serif", "px": 26, "colour": (0, 90, 0), "angle": -3},
    ], (300, 300))     # square: the detector runs at 736 x 736 (a 300 x 120 image: 1856 x 736, 17 -> 5 s)
    got = _ocr("wasm").read(_image(pil))["lines"]
    _compare(got, _ref_lines(reference, pil))


def test_cli_json(tmp_path):
    # square: the detector runs at 736 x 736 (280 x 80 would be 2576 x 736, 11 -> 7 s)
    pil = make_samples.render([{"text": "Command line", "xy": (20, 20), "px": 30}], (280, 280))
    path = tmp_path / "x.jpg"
    pil.save(path, quality=95)
    out = subprocess.run([sys.executable, str(DEMO / "ocr.py"), str(path), "--json"], capture_output=True,
                         text=True, timeout=300, check=True).stdout
    lines = json.loads(out)
    assert [ln["text"] for ln in lines] == ["Command line"]
    assert set(lines[0]) == {"text", "score", "box"} and len(lines[0]["box"]) == 4
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    r = subprocess.run([sys.executable, str(DEMO / "ocr.py"), str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "bad.png" in r.stderr
