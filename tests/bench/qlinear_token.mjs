// One SmolLM2-135M decoded token's q_linear calls (30 layers x 7 Q4_1 (or Q8_0) weights of random
// blocks + the Q8_0 head, 96 MB streamed) on two builds of the kernel module, alternating; CPU time
// of this thread (robust to other processes on a busy machine); checks both give the same bits.
//   node tests/bench/qlinear_token.mjs A.wasm B.wasm [rounds=10] [layer qtype: 3 (q4_1) | 8 (q8_0)] [model|hot]
// Build a variant from a copy of wasm/kernels: sys.path.insert(0, 'wasm'); import build_kernels as bk;
// bk.SRC = copy; bk.build(out). (hot: one layer's weights reused, i.e. in cache)
import fs from "node:fs";
const [fa, fb, roundsS = "10", qtS = "3", mode = "model"] = process.argv.slice(2);
const rounds = +roundsS, QT = +qtS;
const NB = { 3: 20, 8: 34 };
const mem = new WebAssembly.Memory({ initial: 4096, maximum: 8192 });  // 256 MB
const inst = (f) => new WebAssembly.Instance(new WebAssembly.Module(fs.readFileSync(f)), { env: { memory: mem } }).exports;
const mods = [inst(fa), inst(fb)];
const u8 = new Uint8Array(mem.buffer);
let top = 1 << 20;
const alloc = (n) => { const a = top; top += (n + 63) & ~63; return a; };
let seed = 12345;
const rnd = () => { seed = (seed * 1103515245 + 12345) >>> 0; return seed >>> 16; };
function weight(qt, n, k) {
  const bs = NB[qt], nb = n * k / 32, a = alloc(nb * bs);
  for (let i = 0; i < nb * bs; i++) u8[a + i] = rnd() & 255;
  for (let b = 0; b < nb; b++) {   // small positive half scales (and min for q4_1)
    const p = a + b * bs;
    u8[p] = rnd() & 255; u8[p + 1] = 0x20;
    if (qt === 3) { u8[p + 2] = rnd() & 255; u8[p + 3] = 0xa0; }
  }
  return a;
}
const D = 576, F = 1536;
const calls = [];   // [w, qt, n, k, xaddr]
const xs = alloc(4 * F), x2 = alloc(4 * F);
const f32 = new Float32Array(mem.buffer);
for (let i = 0; i < F; i++) f32[xs / 4 + i] = Math.sin(i * 0.37) * 0.5;
const layers = mode === "hot" ? 1 : 30;
for (let l = 0; l < layers; l++) {
  for (const [n, k] of [[D, D], [192, D], [192, D], [D, D], [F, D], [F, D], [D, F]]) calls.push([weight(QT, n, k), QT, n, k]);
}
if (mode === "hot") { const one = calls.slice(); for (let l = 1; l < 30; l++) calls.push(...one); }
calls.push([weight(8, 49152, D), 8, 49152, D]);
const ys = calls.map(([w, qt, n]) => [alloc(4 * n), alloc(4 * n)]);
const scratch = alloc(4 * 200000), prm = alloc(16);
const i32 = new Int32Array(mem.buffer);
function token(m, which) {
  const q = mods[m].q_linear;
  const c0 = process.cpuUsage();
  for (let c = 0; c < calls.length; c++) {
    const [w, qt, n, k] = calls[c];
    i32[prm / 4] = qt; i32[prm / 4 + 1] = 1; i32[prm / 4 + 2] = n; i32[prm / 4 + 3] = k;
    const rc = q(w, xs, ys[c][which], scratch, prm);
    if (rc) throw new Error("rc " + rc);
  }
  const c1 = process.cpuUsage(c0);
  return (c1.user + c1.system) / 1000;
}
const times = [[], []];
const headT = [[], []];
for (let r = 0; r < rounds; r++) {
  for (const m of r % 2 ? [1, 0] : [0, 1]) times[m].push(token(m, m));
}
let same = true;
for (let c = 0; c < calls.length; c++) {
  const n = calls[c][2];
  const a = new Uint32Array(mem.buffer, ys[c][0], n), b = new Uint32Array(mem.buffer, ys[c][1], n);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) { if (same) console.log(`differs: call ${c} (n ${n}, k ${calls[c][3]}) at ${i}: ${new Float32Array(a.buffer, a.byteOffset, n)[i]} vs ${new Float32Array(b.buffer, b.byteOffset, n)[i]}`); same = false; break; }
}
const st = (t) => { const s = t.slice().sort((a, b) => a - b); return `min ${s[0].toFixed(2)} med ${s[s.length >> 1].toFixed(2)}`; };
console.log(`${mode} qt=${QT}: A ${st(times[0])} ms | B ${st(times[1])} ms | identical: ${same}`);
