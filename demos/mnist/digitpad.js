// digitpad.js: the drawing pad and the MNIST-style preprocessing of a drawing, shared by the
// pages that read hand-drawn digits (demos/mnist/ and demos/train/ import it from here).
//
// Exports:
//   SIDE (28), BRUSH (stroke width on a 280-px pad)
//   preprocess(canvas) -> {pixels: Float32Array(784) in [0, 1], inkSide} | null (nothing drawn)
//        what MNIST did to each scanned digit: crop to the ink, scale the larger side to 20 px
//        (area averaging), put the centre of mass at pixel (14, 14). inkSide: the ink's bounding
//        box side in 280-px pad units (a dot is not a digit).
//   clearPad(canvas), setupPad(canvas, onStroke) (mouse, pen or finger; onStroke() after each
//   stroke), showInput(ctx, pixels) (paint the 28x28 input, or black for null),
//   imageCanvas(bytes) (a 28x28 canvas of a uint8 MNIST image), drawImage(canvas, bytes)
//   (that image scaled onto the pad).

export const SIDE = 28;
const BOX = 20;            // MNIST: the ink's bounding box is scaled to fit 20x20...
const CENTRE = 14;         // ...then shifted so its centre of mass sits at pixel (14, 14)
export const BRUSH = 20;   // stroke width on the 280 px pad: ~2 px after scaling, like MNIST

/** Area-average resampling of a 1-D signal of length n to length m (m <= n or not). */
function resampleWeights(n, m) {
  const out = [];
  const step = n / m;
  for (let j = 0; j < m; j++) {
    const a = j * step, b = (j + 1) * step;
    const taps = [];
    for (let k = Math.floor(a); k < Math.min(n, Math.ceil(b)); k++) {
      const w = Math.min(b, k + 1) - Math.max(a, k);
      if (w > 0) taps.push([k, w / step]);
    }
    out.push(taps);
  }
  return out;
}

/** {pixels: 28x28 Float32Array in [0, 1], inkSide} from the drawing, or null if nothing is drawn. */
export function preprocess(canvas) {
  const W = canvas.width, H = canvas.height;
  const rgba = canvas.getContext("2d", { willReadFrequently: true }).getImageData(0, 0, W, H).data;
  const ink = new Float32Array(W * H);
  let x0 = W, y0 = H, x1 = -1, y1 = -1;
  for (let y = 0; y < H; y++) {
    for (let x = 0; x < W; x++) {
      const v = rgba[(y * W + x) * 4] / 255;   // white on black: the red channel is the ink
      ink[y * W + x] = v;
      if (v > 0.05) {
        if (x < x0) x0 = x;
        if (x > x1) x1 = x;
        if (y < y0) y0 = y;
        if (y > y1) y1 = y;
      }
    }
  }
  if (x1 < 0) return null;
  const bw = x1 - x0 + 1, bh = y1 - y0 + 1;
  const inkSide = Math.max(bw, bh) * 280 / Math.max(W, H);   // in 280-px pad units
  const scale = BOX / Math.max(bw, bh);
  const tw = Math.max(1, Math.round(bw * scale)), th = Math.max(1, Math.round(bh * scale));
  // Separable area averaging: columns first (bw -> tw), then rows (bh -> th).
  const wx = resampleWeights(bw, tw), wy = resampleWeights(bh, th);
  const tmp = new Float32Array(bh * tw);
  for (let y = 0; y < bh; y++) {
    const row = (y0 + y) * W + x0;
    for (let j = 0; j < tw; j++) {
      let s = 0;
      for (const [k, w] of wx[j]) s += ink[row + k] * w;
      tmp[y * tw + j] = s;
    }
  }
  const small = new Float32Array(th * tw);
  let mass = 0, mx = 0, my = 0;
  for (let i = 0; i < th; i++) {
    for (let j = 0; j < tw; j++) {
      let s = 0;
      for (const [k, w] of wy[i]) s += tmp[k * tw + j] * w;
      s = Math.min(1, s);
      small[i * tw + j] = s;
      mass += s; mx += s * j; my += s * i;
    }
  }
  // Integer shift that puts the centre of mass at (14, 14), kept inside the 28x28 frame.
  const clamp = (v, lo, hi) => Math.max(lo, Math.min(hi, v));
  const ox = clamp(Math.round(CENTRE - mx / mass), 0, SIDE - tw);
  const oy = clamp(Math.round(CENTRE - my / mass), 0, SIDE - th);
  const pixels = new Float32Array(SIDE * SIDE);
  for (let i = 0; i < th; i++) {
    for (let j = 0; j < tw; j++) pixels[(oy + i) * SIDE + ox + j] = small[i * tw + j];
  }
  return { pixels, inkSide };
}

/** Paint the 28x28 input (null: black) on a 28x28 canvas context. */
export function showInput(ctx, pixels) {
  const img = ctx.createImageData(SIDE, SIDE);
  for (let i = 0; i < SIDE * SIDE; i++) {
    const v = Math.round((pixels ? pixels[i] : 0) * 255);
    img.data.set([v, v, v, 255], i * 4);
  }
  ctx.putImageData(img, 0, 0);
}

function ctxOf(pad) {
  return pad.getContext("2d", { willReadFrequently: true });
}

export function clearPad(pad) {
  const c = ctxOf(pad);
  c.fillStyle = "#000";
  c.fillRect(0, 0, pad.width, pad.height);
}

/** White strokes on the black pad; `onStroke()` runs when a stroke ends. */
export function setupPad(pad, onStroke) {
  const padCtx = ctxOf(pad);
  clearPad(pad);
  let last = null;
  const at = (e) => {
    const r = pad.getBoundingClientRect();
    return [(e.clientX - r.left) * pad.width / r.width, (e.clientY - r.top) * pad.height / r.height];
  };
  const dot = ([x, y]) => {
    padCtx.beginPath();
    padCtx.arc(x, y, BRUSH / 2, 0, 2 * Math.PI);
    padCtx.fill();
  };
  pad.addEventListener("pointerdown", (e) => {
    if (e.button !== 0) return;
    pad.setPointerCapture(e.pointerId);
    padCtx.fillStyle = "#fff";
    last = at(e);
    dot(last);
  });
  pad.addEventListener("pointermove", (e) => {
    if (!last) return;
    const p = at(e);
    padCtx.strokeStyle = "#fff";
    padCtx.lineWidth = BRUSH;
    padCtx.lineCap = "round";
    padCtx.beginPath();
    padCtx.moveTo(last[0], last[1]);
    padCtx.lineTo(p[0], p[1]);
    padCtx.stroke();
    last = p;
  });
  const end = () => {
    if (!last) return;
    last = null;
    onStroke();
  };
  pad.addEventListener("pointerup", end);
  pad.addEventListener("pointercancel", end);
}

/** A 28x28 canvas showing a uint8 MNIST image. */
export function imageCanvas(bytes) {
  const canvas = document.createElement("canvas");
  canvas.width = canvas.height = SIDE;
  const c = canvas.getContext("2d");
  const img = c.createImageData(SIDE, SIDE);
  for (let i = 0; i < SIDE * SIDE; i++) img.data.set([bytes[i], bytes[i], bytes[i], 255], i * 4);
  c.putImageData(img, 0, 0);
  return canvas;
}

/** A uint8 MNIST image scaled up onto the pad (replacing the drawing). */
export function drawImage(pad, bytes) {
  const c = ctxOf(pad);
  clearPad(pad);
  c.imageSmoothingEnabled = true;
  c.drawImage(imageCanvas(bytes), 0, 0, pad.width, pad.height);
}
