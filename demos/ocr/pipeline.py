"""PP-OCRv4 over ember: image -> text lines, the same code in CPython and in the page.

    ocr = OCR.from_folder("demos/ocr", device="numpy")
    result = ocr.read(image)              # image: images.Image (RGB bytes)
    result["lines"]                       # [{"text", "score", "box": [[x, y] x4]}] in reading order
    result["timings"]                     # ms per stage

Stages (settings from the wheel's ``config.yaml``):

1. *preprocess*: images over 2000 px are shrunk, very flat ones padded (letterbox); the image
   goes to the device, is resized (bilinear, sides multiples of 32, the short side to 736)
   and normalised to [-1, 1] in BGR order, as PaddleOCR's models were trained.
2. *detect*: the DBNet detector gives a text probability map.
3. *boxes*: threshold 0.3, 2x2 dilation, connected components, minimum-area rotated rectangles,
   mean probability >= 0.5, unclip by 1.6, back to image coordinates (``geometry``).
4. *crop*: each box is rectified to an upright image by a perspective warp (bilinear sampling
   with ``GridSample`` on the device); tall crops are turned 90 degrees.
5. *classify*: the direction classifier (48x192 inputs, batches of 6) says which crops are
   upside down (score > 0.9): those are turned 180 degrees.
6. *recognise*: crops resized to height 48, batches of 6 of similar widths, the SVTR recogniser,
   then CTC greedy decoding with the dictionary from the model's metadata (``character``);
   lines scoring under 0.5 are dropped.
"""
from __future__ import annotations

import math
import os
import time
from array import array

import ember
from ember.onnx import functional as F

import geometry

DET_FILE = "ch_PP-OCRv4_det_infer.onnx"
CLS_FILE = "ch_ppocr_mobile_v2.0_cls_infer.onnx"
REC_FILE = "ch_PP-OCRv4_rec_infer.onnx"
CONFIG_FILE = "config.yaml"
STAGES = ("preprocess", "detect", "boxes", "crop", "classify", "recognise")


# ---- settings and model metadata -------------------------------------------------------------

def _scalar(text: str):
    t = text.strip()
    if t.startswith("[") and t.endswith("]"):
        return [_scalar(v) for v in t[1:-1].split(",") if v.strip()]
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        return t[1:-1]
    low = t.lower()
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(t)
        except ValueError:
            pass
    return t


def parse_config(text: str) -> dict:
    """The subset of YAML that ``config.yaml`` uses: nested mappings by indentation, scalars,
    flow lists ``[a, b]``, anchors ``&name`` and aliases ``*name``, ``#`` comments."""
    root: dict = {}
    stack = [(-1, root)]
    anchors: dict = {}
    for raw in text.splitlines():
        line = raw.split(" #")[0].rstrip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        key, sep, val = line.strip().partition(":")
        if not sep:
            raise ValueError(f"config: cannot read line {raw!r}")
        while stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        val = val.strip()
        if not val:
            child: dict = {}
            parent[key.strip()] = child
            stack.append((indent, child))
            continue
        anchor = None
        if val.startswith("&"):
            anchor, _, val = val[1:].partition(" ")
        value = anchors[val.strip()[1:]] if val.strip().startswith("*") else _scalar(val)
        if anchor:
            anchors[anchor] = value
        parent[key.strip()] = value
    return root


def _varint(data, pos):
    shift = result = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def onnx_metadata(data) -> dict:
    """The ``metadata_props`` of an ONNX file (ModelProto field 14: key/value strings), read by
    skipping over the other top-level fields (the graph is never parsed here)."""
    out, pos, n = {}, 0, len(data)
    while pos < n:
        tag, pos = _varint(data, pos)
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            _, pos = _varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            ln, pos = _varint(data, pos)
            if field == 14:
                entry, p, key, value = data[pos:pos + ln], 0, "", ""
                while p < len(entry):
                    t, p = _varint(entry, p)
                    sl, p = _varint(entry, p)
                    s = bytes(entry[p:p + sl]).decode("utf-8")
                    p += sl
                    if t >> 3 == 1:
                        key = s
                    elif t >> 3 == 2:
                        value = s
                out[key] = value
            pos += ln
        else:
            raise ValueError(f"not an ONNX file (protobuf wire type {wire} at byte {pos})")
    return out


# ---- tensors ---------------------------------------------------------------------------------

def raw(t) -> bytes:
    """A tensor's values as little-endian bytes of its dtype (one copy; no Python lists)."""
    return t._bytes()


def image_tensor(img, device: str):
    """(1, 3, H, W) float32 tensor of 0..255 values in BGR order (PaddleOCR's channel order)."""
    d = img.data
    planes = d[2::3] + d[1::3] + d[0::3]
    return ember.from_bytes(planes, (1, 3, img.height, img.width), "uint8", device=device).astype(ember.float32)


def resize(x, h: int, w: int):
    """Bilinear resize of an (N, C, H, W) tensor (half-pixel centres, like cv2.resize)."""
    n, c, h0, w0 = x.shape
    if (h0, w0) == (h, w):
        return x
    return F.resize(x, (n, c, h, w), [1.0, 1.0, h / h0, w / w0], mode="linear", coord_mode="half_pixel")


def normalise(x):
    """0..255 -> [-1, 1]: (x / 255 - 0.5) / 0.5."""
    return x * (1 / 127.5) - 1.0


def _solve(a, b):
    """Gaussian elimination with partial pivoting: x with a x = b (small dense systems)."""
    n = len(b)
    m = [list(row) + [v] for row, v in zip(a, b)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        if abs(m[c][c]) < 1e-12:
            raise ValueError("degenerate box")
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                for k in range(c, n + 1):
                    m[r][k] -= f * m[c][k]
    return [m[i][n] / m[i][i] for i in range(n)]


def homography(src, dst):
    """The 3x3 projective map (row major, h[8] = 1) taking the 4 ``src`` points to ``dst``."""
    a, b = [], []
    for (x, y), (u, v) in zip(src, dst):
        a.append([x, y, 1, 0, 0, 0, -u * x, -u * y])
        b.append(u)
        a.append([0, 0, 0, x, y, 1, -v * x, -v * y])
        b.append(v)
    return _solve(a, b) + [1.0]


def crop_box(image, box, device: str):
    """The box's contents rectified to an upright (1, 3, h, w) tensor: every output pixel (u, v)
    samples the image at the projective map of the box's corners (bilinear, edges repeated)."""
    p = box
    w = int(max(math.dist(p[0], p[1]), math.dist(p[2], p[3])))
    h = int(max(math.dist(p[0], p[3]), math.dist(p[1], p[2])))
    w, h = max(w, 1), max(h, 1)
    m = homography([(0, 0), (w, 0), (w, h), (0, h)], p)    # output pixel -> image pixel
    H, W = image.shape[2], image.shape[3]
    u = ember.arange(w, dtype=ember.float32, device=device).reshape((1, w))
    v = ember.arange(h, dtype=ember.float32, device=device).reshape((h, 1))
    den = u * m[6] + v * m[7] + m[8]
    x = (u * m[0] + v * m[1] + m[2]) / den
    y = (u * m[3] + v * m[4] + m[5]) / den
    gx = (x * 2.0 + 1.0) * (1.0 / W) - 1.0                     # pixel -> GridSample's [-1, 1]
    gy = (y * 2.0 + 1.0) * (1.0 / H) - 1.0
    grid = ember.stack([gx, gy], axis=-1).reshape((1, h, w, 2))
    out = F.grid_sample(image, grid, mode="linear", padding_mode="border", align_corners=False)
    if h / w >= 1.5:                                          # a vertical line: turn it 90 degrees
        out = ember.flip(out.transpose(2, 3), axis=2)
    return out


def _fit(crop, height: int, width: int):
    """Resize a (1, 3, h, w) crop to ``height`` keeping its aspect ratio (at most ``width``
    wide), normalise it and pad it with zeros to ``width``."""
    h, w = crop.shape[2], crop.shape[3]
    rw = min(width, int(math.ceil(height * w / h)))
    x = normalise(resize(crop, height, rw))
    if rw < width:
        x = ember.pad(x, [(0, 0), (0, 0), (0, 0), (0, width - rw)])
    return x


# ---- the pipeline ----------------------------------------------------------------------------

class OCR:
    """The three models and the settings, on one ember device."""

    def __init__(self, det, cls, rec, config_text: str, device: str = "numpy", compile: bool = True):
        cfg = parse_config(config_text)
        self.config = cfg
        self.g, self.det_cfg, self.cls_cfg, self.rec_cfg = cfg["Global"], cfg["Det"], cfg["Cls"], cfg["Rec"]
        self.device = device
        rec_bytes = _read(rec)
        meta = onnx_metadata(rec_bytes)
        if "character" not in meta:
            raise ValueError("the recogniser's ONNX metadata has no 'character' dictionary")
        # index 0 is the CTC blank; the space is the last class
        self.characters = ["<blank>"] + meta["character"].splitlines() + [" "]
        self.det = ember.onnx.load(_read(det), device=device, compile=compile)
        self.cls = ember.onnx.load(_read(cls), device=device, compile=compile)
        self.rec = ember.onnx.load(rec_bytes, device=device, compile=compile)

    @classmethod
    def from_folder(cls, folder: str, device: str = "numpy", **kw) -> "OCR":
        with open(os.path.join(folder, CONFIG_FILE), encoding="utf-8") as f:
            text = f.read()
        return cls(os.path.join(folder, DET_FILE), os.path.join(folder, CLS_FILE),
                   os.path.join(folder, REC_FILE), text, device=device, **kw)

    # -- stages --
    def detect(self, img, timings: dict):
        """Boxes in ``img`` coordinates (reading order) and the image tensor on the device."""
        t0 = time.perf_counter()
        dcfg = self.det_cfg
        side = dcfg.get("limit_side_len", 736)
        h, w = img.height, img.width
        if dcfg.get("limit_type", "min") == "min":
            ratio = side / min(h, w) if min(h, w) < side else 1.0
        else:
            ratio = side / max(h, w) if max(h, w) > side else 1.0
        rh = max(32, int(round(int(h * ratio) / 32) * 32))
        rw = max(32, int(round(int(w * ratio) / 32) * 32))
        image = image_tensor(img, self.device)
        x = normalise(resize(image, rh, rw))
        timings["preprocess"] += _ms(t0)
        t0 = time.perf_counter()
        prob = self.det(x)
        mask = raw((prob > float(dcfg.get("thresh", 0.3))).astype(ember.uint8))
        probs = array("f", raw(prob))
        timings["detect"] += _ms(t0)
        t0 = time.perf_counter()
        if dcfg.get("use_dilation", True):
            mask = geometry.dilate2x2(mask, rw, rh)
        boxes, scores = geometry.boxes_from_map(
            probs, mask, rw, rh, w, h, box_thresh=float(dcfg.get("box_thresh", 0.5)),
            unclip_ratio=float(dcfg.get("unclip_ratio", 1.6)),
            max_candidates=int(dcfg.get("max_candidates", 1000)))
        boxes = geometry.clean_boxes(boxes, w, h)
        boxes = [boxes[i] for i in geometry.reading_order(boxes)]
        timings["boxes"] += _ms(t0)
        return boxes, image

    def classify(self, crops, timings: dict):
        """Turn the crops the classifier finds upside down by 180 degrees; returns the
        (label, score) pairs."""
        t0 = time.perf_counter()
        c, hh, ww = self.cls_cfg.get("cls_image_shape", [3, 48, 192])
        batch = int(self.cls_cfg.get("cls_batch_num", 6))
        thresh = float(self.cls_cfg.get("cls_thresh", 0.9))
        labels = self.cls_cfg.get("label_list", ["0", "180"])
        order = sorted(range(len(crops)), key=lambda i: crops[i].shape[3] / crops[i].shape[2])
        res = [None] * len(crops)
        for b in range(0, len(order), batch):
            idx = order[b:b + batch]
            x = ember.concat([_fit(crops[i], hh, ww) for i in idx], axis=0)
            probs = self.cls(x).tolist()
            for i, p in zip(idx, probs):
                k = max(range(len(p)), key=p.__getitem__)
                res[i] = (labels[k], p[k])
                if "180" in labels[k] and p[k] > thresh:
                    crops[i] = ember.flip(crops[i], axis=(2, 3))
        timings["classify"] += _ms(t0)
        return res

    def recognise(self, crops, timings: dict):
        """(text, score) per crop: batches of crops of similar widths, CTC greedy decoding."""
        t0 = time.perf_counter()
        c, hh, ww = self.rec_cfg.get("rec_img_shape", [3, 48, 320])
        batch = int(self.rec_cfg.get("rec_batch_num", 6))
        ratios = [cr.shape[3] / cr.shape[2] for cr in crops]
        order = sorted(range(len(crops)), key=lambda i: ratios[i])
        res = [("", 0.0)] * len(crops)
        for b in range(0, len(order), batch):
            idx = order[b:b + batch]
            wide = int(hh * max([ww / hh] + [ratios[i] for i in idx]))
            x = ember.concat([_fit(crops[i], hh, wide) for i in idx], axis=0)
            preds = self.rec(x)
            best = ember.argmax(preds, axis=2).tolist()
            conf = ember.max(preds, axis=2).tolist()
            for i, ks, ps in zip(idx, best, conf):
                res[i] = self.decode(ks, ps)
        timings["recognise"] += _ms(t0)
        return res

    def decode(self, ks, ps):
        """CTC greedy decoding: repeated classes merged, blanks dropped; the score is the mean
        probability of the kept steps."""
        chars, kept, prev = [], [], None
        for k, p in zip(ks, ps):
            if k != prev and k != 0:
                chars.append(self.characters[k] if k < len(self.characters) else "")
                kept.append(p)
            prev = k
        return "".join(chars), (sum(kept) / len(kept) if kept else 0.0)

    # -- the whole thing --
    def read(self, img) -> dict:
        """``{"lines": [{"text", "score", "box"}], "timings": {stage: ms}, "width", "height",
        "device"}`` for an ``images.Image``."""
        timings = {s: 0.0 for s in STAGES}
        t_all = time.perf_counter()
        g = self.g
        raw_w, raw_h = img.width, img.height
        t0 = time.perf_counter()
        work, ratio_w, ratio_h = img, 1.0, 1.0
        max_side, min_side = int(g.get("max_side_len", 2000)), int(g.get("min_side_len", 30))
        if max(work.width, work.height) > max_side or min(work.width, work.height) < min_side:
            f = max_side / max(work.width, work.height) if max(work.width, work.height) > max_side \
                else min_side / min(work.width, work.height)
            nh = max(32, int(round(int(work.height * f) / 32) * 32))
            nw = max(32, int(round(int(work.width * f) / 32) * 32))
            work = resize_image(work, nw, nh, self.device)
            ratio_w, ratio_h = raw_w / nw, raw_h / nh
        top = 0
        limit = g.get("width_height_ratio", 8)
        if work.height <= int(g.get("min_height", 30)) or (limit != -1 and work.width / work.height > limit):
            new_h = max(int(work.width / limit), int(g.get("min_height", 30))) * 2
            top = int(abs(new_h - work.height) / 2)
            work = work.padded(top)
        timings["preprocess"] += _ms(t0)
        boxes, image = self.detect(work, timings)
        lines = []
        if boxes:
            t0 = time.perf_counter()
            crops = [crop_box(image, b, self.device) for b in boxes]
            timings["crop"] += _ms(t0)
            if g.get("use_cls", True):
                self.classify(crops, timings)
            texts = self.recognise(crops, timings)
            min_score = float(g.get("text_score", 0.5))
            for box, (text, score) in zip(boxes, texts):
                if score < min_score:
                    continue
                pts = [[_coord((x) * ratio_w, raw_w), _coord((y - top) * ratio_h, raw_h)] for x, y in box]
                lines.append({"text": text, "score": round(float(score), 5), "box": pts})
        timings["total"] = _ms(t_all)
        return {"lines": lines, "timings": {k: round(v, 2) for k, v in timings.items()},
                "width": raw_w, "height": raw_h, "device": self.device}


def resize_image(img, w: int, h: int, device: str):
    """A new ``Image`` resized on the device (bilinear, rounded to bytes)."""
    from images import Image
    t = resize(image_tensor(img, device), h, w)
    t = ember.clip(t + 0.5, 0.0, 255.0).astype(ember.uint8)
    b = raw(t)
    n = w * h
    bgr = b[:n], b[n:2 * n], b[2 * n:]
    out = bytearray(3 * n)
    out[0::3], out[1::3], out[2::3] = bgr[2], bgr[1], bgr[0]
    return Image(w, h, bytes(out))


def _coord(v: float, limit: int):
    v = min(max(v, 0.0), float(limit))
    return int(v) if v == int(v) else round(v, 2)


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


def _read(src):
    if isinstance(src, (bytes, bytearray, memoryview)):
        return bytes(src)
    if hasattr(src, "to_bytes"):        # a JS Uint8Array in Pyodide
        return src.to_bytes()
    with open(src, "rb") as f:
        return f.read()
