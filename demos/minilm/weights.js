// weights.js: the MiniLM page's float16 weights, widened to float32 inside ember's Worker.
//
// demo.js runs `worker.callJs("weights.js", "widen", [url, path])`: the worker downloads the
// float16 safetensors file (from the browser's cache after the first visit), rewrites every F16
// tensor as F32 and writes the result to `path` in Pyodide's file system, for app.load(). Done
// in JS because it is one table lookup per value here and a Python loop per value in Pyodide;
// done in the worker because 11 M lookups would hold the page's thread for a while.
//
//   widen(ctx, url, path) -> {bytes (downloaded), widenedBytes, cached, ms}

/** float16 bit pattern -> value, for all 65536 patterns (one lookup per weight afterwards). */
function halfTable() {
  const t = new Float32Array(65536);
  for (let h = 0; h < 65536; h++) {
    const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 31, m = h & 1023;
    t[h] = e === 0 ? s * m * 2 ** -24
         : e === 31 ? (m ? NaN : s * Infinity)
         : s * 2 ** (e - 15) * (1 + m / 1024);
  }
  return t;
}

/** A safetensors file with every F16 tensor rewritten as F32 (same names, shapes, order). */
export function widenSafetensors(bytes, name = "weights") {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const n = Number(view.getBigUint64(0, true));
  if (n <= 0 || 8 + n > bytes.length) throw new Error(`${name}: not a safetensors file (header length ${n})`);
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + n)));
  const names = Object.keys(header).filter((k) => k !== "__metadata__")
    .sort((a, b) => header[a].data_offsets[0] - header[b].data_offsets[0]);
  const out = {};
  if (header.__metadata__) out.__metadata__ = header.__metadata__;
  let pos = 0;
  for (const k of names) {
    const e = header[k];
    const size = e.data_offsets[1] - e.data_offsets[0];
    const newSize = e.dtype === "F16" ? size * 2 : size;
    out[k] = { dtype: e.dtype === "F16" ? "F32" : e.dtype, shape: e.shape, data_offsets: [pos, pos + newSize] };
    pos += newSize;
  }
  let text = new TextEncoder().encode(JSON.stringify(out));
  const padded = new Uint8Array(Math.ceil(text.length / 8) * 8).fill(0x20);
  padded.set(text);
  text = padded;
  const result = new Uint8Array(8 + text.length + pos);
  new DataView(result.buffer).setBigUint64(0, BigInt(text.length), true);
  result.set(text, 8);
  const base = 8 + text.length, src0 = 8 + n;
  const table = halfTable();
  for (const k of names) {
    const [b, e] = header[k].data_offsets;
    const src = bytes.subarray(src0 + b, src0 + e);
    const at = base + out[k].data_offsets[0];
    if (header[k].dtype !== "F16") {
      result.set(src, at);
      continue;
    }
    // Uint16Array needs an even byte offset; copy the slice when it is not.
    const aligned = (bytes.byteOffset + src0 + b) % 2 === 0 ? src : src.slice();
    const halves = new Uint16Array(aligned.buffer, aligned.byteOffset, aligned.length / 2);
    const floats = new Float32Array(result.buffer, at, halves.length);
    for (let i = 0; i < halves.length; i++) floats[i] = table[halves[i]];
  }
  return result;
}

/** Download the float16 file at `url`, widen it and write it to `path` (in the worker). */
export async function widen(ctx, url, path) {
  const { bytes, cached } = await ctx.fetch(url);
  const t0 = performance.now();
  const full = widenSafetensors(bytes, url.split("/").pop());
  ctx.writeFile(path, full);
  return { bytes: bytes.length, widenedBytes: full.length, cached, ms: performance.now() - t0 };
}
