"""Text boxes from the detector's probability map, in pure Python (no OpenCV, pyclipper or
shapely): thresholding and dilation on bytes, connected components from row runs, convex
hulls, minimum-area rotated rectangles, the DB "unclip" expansion, box scores, ordering.

A box is four ``(x, y)`` float pairs. Everything here is plain Python on ``bytes`` /
``array`` data, so it runs the same in CPython and in Pyodide.

>>> hull([(0, 0), (2, 0), (1, 1), (2, 2), (0, 2)])
[(0, 0), (2, 0), (2, 2), (0, 2)]
>>> rect = min_area_rect([(0, 0), (4, 0), (4, 2), (0, 2)])
>>> [round(v, 6) for v in rect[:4]]
[2.0, 1.0, 4.0, 2.0]
"""
from __future__ import annotations

import math
import re

_RUN = re.compile(rb"\x01+")


def dilate2x2(mask: bytes, width: int, height: int) -> bytes:
    """OpenCV's ``dilate`` with a 2x2 kernel of ones (anchor at its centre): a pixel is set when
    it or its left, upper or upper-left neighbour is. ``mask`` holds one 0/1 byte per pixel,
    row major. Done with big-integer shifts (one byte per pixel never carries into the next)."""
    n = width * height
    m = int.from_bytes(mask, "little")
    not_first_col = int.from_bytes((b"\x00" + b"\xff" * (width - 1)) * height, "little")
    m |= (m << 8) & not_first_col            # from the left neighbour (x-1 -> x), not across rows
    m |= m << (8 * width)                     # from the row above
    return (m & ((1 << (8 * n)) - 1)).to_bytes(n, "little")


def components(mask: bytes, width: int, height: int):
    """8-connected components of the set pixels: a list of ``{row: [xmin, xmax]}`` dicts (the
    extreme pixels of each row, all a convex hull needs), found from the runs of each row."""
    parent: list[int] = []

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    runs = []          # (row, x0, x1, label)
    prev: list = []
    for y in range(height):
        row = mask[y * width:(y + 1) * width]
        cur = []
        j = 0
        for m in _RUN.finditer(row):
            a, b = m.start(), m.end() - 1
            label = None
            while j < len(prev) and prev[j][1] < a - 1:
                j += 1
            k = j
            while k < len(prev) and prev[k][0] <= b + 1:
                r = find(prev[k][2])
                if label is None:
                    label = r
                elif r != label:
                    parent[r] = label
                k += 1
            if label is None:
                label = len(parent)
                parent.append(label)
            cur.append((a, b, label))
            runs.append((y, a, b, label))
        prev = cur
    comps: dict = {}
    for y, a, b, label in runs:
        rows = comps.setdefault(find(label), {})
        ext = rows.get(y)
        if ext is None:
            rows[y] = [a, b]
        else:
            if a < ext[0]:
                ext[0] = a
            if b > ext[1]:
                ext[1] = b
    return list(comps.values())


def hull(points):
    """Convex hull (Andrew's monotone chain), counter-clockwise in image coordinates' maths
    orientation, without collinear points."""
    pts = sorted(set(points))
    if len(pts) <= 2:
        return pts

    def cross(o, a, b):
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    lower, upper = [], []
    for p in pts:
        while len(lower) >= 2 and cross(lower[-2], lower[-1], p) <= 0:
            lower.pop()
        lower.append(p)
    for p in reversed(pts):
        while len(upper) >= 2 and cross(upper[-2], upper[-1], p) <= 0:
            upper.pop()
        upper.append(p)
    return lower[:-1] + upper[:-1]


def min_area_rect(points):
    """The rotated rectangle of least area around ``points`` (rotating calipers over the convex
    hull): ``(cx, cy, w, h, ux, uy)`` with ``(ux, uy)`` the unit vector along ``w``."""
    hp = hull(points)
    if len(hp) == 1:
        return (hp[0][0], hp[0][1], 0.0, 0.0, 1.0, 0.0)
    best = None
    for i in range(len(hp)):
        x0, y0 = hp[i]
        x1, y1 = hp[(i + 1) % len(hp)]
        dx, dy = x1 - x0, y1 - y0
        ln = math.hypot(dx, dy)
        if ln == 0:
            continue
        ux, uy = dx / ln, dy / ln
        us = [px * ux + py * uy for px, py in hp]
        vs = [-px * uy + py * ux for px, py in hp]
        u0, u1, v0, v1 = min(us), max(us), min(vs), max(vs)
        area = (u1 - u0) * (v1 - v0)
        if best is None or area < best[0] - 1e-9:
            best = (area, u0, u1, v0, v1, ux, uy)
    _, u0, u1, v0, v1, ux, uy = best
    cu, cv = (u0 + u1) / 2, (v0 + v1) / 2
    cx, cy = cu * ux - cv * uy, cu * uy + cv * ux
    return (cx, cy, u1 - u0, v1 - v0, ux, uy)


def rect_corners(rect):
    """The four corners of ``min_area_rect``'s rectangle, ordered like the DB post-processing
    orders them: of the two leftmost points the upper one first, then the upper right, lower
    right and lower left."""
    cx, cy, w, h, ux, uy = rect
    ax, ay = ux * w / 2, uy * w / 2           # half the w side
    bx, by = -uy * h / 2, ux * h / 2          # half the h side
    pts = [(cx - ax - bx, cy - ay - by), (cx + ax - bx, cy + ay - by),
           (cx + ax + bx, cy + ay + by), (cx - ax + bx, cy - ay + by)]
    pts.sort(key=lambda p: p[0])
    (l1, l2), (r1, r2) = pts[:2], pts[2:]
    tl, bl = (l1, l2) if l1[1] <= l2[1] else (l2, l1)
    tr, br = (r1, r2) if r1[1] <= r2[1] else (r2, r1)
    return [tl, tr, br, bl]


def box_score(prob, width: int, height: int, box) -> float:
    """Mean probability inside the box (corners rounded to pixels, as a filled polygon, over the
    pixels whose centres it covers, edges included): the DB "fast" score."""
    pts = [(int(round(x)), int(round(y))) for x, y in box]
    xs = [p[0] for p in pts]
    ys = [p[1] for p in pts]
    xmin = min(max(math.floor(min(xs)), 0), width - 1)
    xmax = min(max(math.ceil(max(xs)), 0), width - 1)
    ymin = min(max(math.floor(min(ys)), 0), height - 1)
    ymax = min(max(math.ceil(max(ys)), 0), height - 1)
    total, count = 0.0, 0
    edges = [(pts[i], pts[(i + 1) % 4]) for i in range(4)]
    for y in range(ymin, ymax + 1):
        lo, hi = None, None
        for (x0, y0), (x1, y1) in edges:
            if (y0 <= y <= y1) or (y1 <= y <= y0):
                if y0 == y1:
                    cands = (x0, x1)
                else:
                    cands = (x0 + (y - y0) * (x1 - x0) / (y1 - y0),)
                for c in cands:
                    lo = c if lo is None or c < lo else lo
                    hi = c if hi is None or c > hi else hi
        if lo is None:
            continue
        a = max(int(math.ceil(lo - 1e-9)), xmin)
        b = min(int(math.floor(hi + 1e-9)), xmax)
        if b < a:
            continue
        base = y * width
        total += sum(prob[base + a:base + b + 1])
        count += b - a + 1
    return total / count if count else 0.0


def unclip(rect, ratio: float):
    """The DB expansion: every side pushed out by ``area * ratio / perimeter`` (the rounded
    corners of a polygon offset never stick out of the grown rectangle)."""
    cx, cy, w, h, ux, uy = rect
    perimeter = 2 * (w + h)
    d = w * h * ratio / perimeter if perimeter else 0.0
    return (cx, cy, w + 2 * d, h + 2 * d, ux, uy)


def boxes_from_map(prob, mask: bytes, width: int, height: int, dest_w: int, dest_h: int, *,
                   box_thresh=0.5, unclip_ratio=1.6, max_candidates=1000, min_size=3):
    """Text boxes (corners in the ``dest_w`` x ``dest_h`` image) and their scores from the
    probability map ``prob`` (flat floats) and its binarised, dilated ``mask``."""
    boxes, scores = [], []
    for rows in components(mask, width, height)[:max_candidates]:
        pts = []
        for y, (a, b) in rows.items():
            pts.append((a, y))
            if b != a:
                pts.append((b, y))
        rect = min_area_rect(pts)
        if min(rect[2], rect[3]) < min_size:
            continue
        score = box_score(prob, width, height, rect_corners(rect))
        if score < box_thresh:
            continue
        grown = unclip(rect, unclip_ratio)
        if min(grown[2], grown[3]) < min_size + 2:
            continue
        box = [(min(max(round(x / width * dest_w), 0), dest_w), min(max(round(y / height * dest_h), 0), dest_h))
               for x, y in rect_corners(grown)]
        boxes.append(box)
        scores.append(score)
    return boxes, scores


def order_clockwise(box):
    """Top-left, top-right, bottom-right, bottom-left: the two leftmost points (upper first),
    then the two rightmost (upper first)."""
    pts = sorted(box, key=lambda p: p[0])
    left = sorted(pts[:2], key=lambda p: p[1])
    right = sorted(pts[2:], key=lambda p: p[1])
    return [left[0], right[0], right[1], left[1]]


def clean_boxes(boxes, width: int, height: int):
    """Clockwise corners clipped to the image (whole pixels); boxes thinner than 4 px dropped."""
    out = []
    for box in boxes:
        box = [(float(int(min(max(x, 0), width - 1))), float(int(min(max(y, 0), height - 1))))
               for x, y in order_clockwise(box)]
        w = int(math.dist(box[0], box[1]))
        h = int(math.dist(box[0], box[3]))
        if w <= 3 or h <= 3:
            continue
        out.append(box)
    return out


def reading_order(boxes):
    """Top to bottom by the top-left corner, then left to right among boxes whose tops are
    within 10 px of each other (one line of text)."""
    order = sorted(range(len(boxes)), key=lambda i: (boxes[i][0][1], boxes[i][0][0]))
    for i in range(len(order) - 1):
        for j in range(i, -1, -1):
            a, b = boxes[order[j]][0], boxes[order[j + 1]][0]
            if abs(b[1] - a[1]) < 10 and b[0] < a[0]:
                order[j], order[j + 1] = order[j + 1], order[j]
            else:
                break
    return order
