// Decoding GGUF quantized blocks from their raw bytes, read as u32 words from `wq` (declared by
// the includer, as is `fn u(k)`, the info words): `item(row byte offset, i)` gives item i of a
// row (8 elements as two vec4s and their positions), for the format the template QT names.
// Template: QT, POS (item positions), AL (every block 4-byte aligned). Included by quant.wgsl;
// ember.webgpu.quant.decoder() renders it for other kernels (attn with its output projection).

const AL: bool = {{AL}};

// the 4 bytes at byte offset o (o even), as one little-endian word
fn word_at(o: u32) -> u32 {
  let a = o >> 2u;
  if (AL) { return wq[a]; }
  let sh = (o & 3u) * 8u;
  let lo = wq[a];
  // (an out-of-range read of the next word is harmless: WebGPU clamps it, select drops it)
  let hi = wq[a + 1u];
  return select((lo >> sh) | (hi << (32u - sh)), lo, sh == 0u);
}

fn half_at(o: u32) -> f32 {
  let w = wq[o >> 2u];
  return unpack2x16float(select(w, w >> 16u, (o & 2u) != 0u)).x;
}

fn byte_at(o: u32) -> u32 { return (wq[o >> 2u] >> ((o & 3u) * 8u)) & 0xffu; }

// bytes of a word as a vec4 of unsigned / signed values
fn ubytes(w: u32) -> vec4<f32> {
  return vec4<f32>(f32(w & 0xffu), f32((w >> 8u) & 0xffu), f32((w >> 16u) & 0xffu), f32(w >> 24u));
}
fn sbytes(w: u32) -> vec4<f32> {
  return vec4<f32>(f32(bitcast<i32>(w << 24u) >> 24u), f32(bitcast<i32>(w << 16u) >> 24u),
                   f32(bitcast<i32>(w << 8u) >> 24u), f32(bitcast<i32>(w) >> 24u));
}
// bit k (k = 0..3) of byte k of w, shifted to bit 4 of each byte (the 5th bit of a 5-bit quant)
fn bit4(w: u32) -> u32 { return ((w & 1u) | ((w << 7u) & 0x100u) | ((w << 14u) & 0x10000u) | ((w << 21u) & 0x1000000u)) << 4u; }

struct Item { w0: vec4<f32>, w1: vec4<f32>, e0: u32, e1: u32 }

// where item i of a row lies (e0, e1): a function of i alone
fn pos_q8_0(i: u32) -> vec2<u32> { let e = (i / 4u) * 32u + (i % 4u) * 8u; return vec2<u32>(e, e + 4u); }
fn pos_q4(i: u32) -> vec2<u32> { let e = (i / 4u) * 32u + (i % 4u) * 4u; return vec2<u32>(e, e + 16u); }
fn pos_k4(i: u32) -> vec2<u32> {
  let w = i % 32u;
  let e = (i / 32u) * 256u + (w / 8u) * 64u + (w % 8u) * 4u;
  return vec2<u32>(e, e + 32u);
}
fn pos_q6_k(i: u32) -> vec2<u32> {
  let w = i % 32u;
  let e = (i / 32u) * 256u + (w / 16u) * 128u + ((w / 8u) % 2u) * 64u + (w % 8u) * 4u;
  return vec2<u32>(e, e + 32u);
}
fn pos_flat(i: u32) -> vec2<u32> { return vec2<u32>(i * 8u, i * 8u + 4u); }

// q8_0: 34 bytes = f16 d, 32 int8
fn item_q8_0(rb: u32, i: u32) -> Item {
  let p = pos_q8_0(i);
  let base = rb + (i / 4u) * 34u;
  let d = half_at(base);
  let o = base + 2u + (i % 4u) * 8u;
  return Item(d * sbytes(word_at(o)), d * sbytes(word_at(o + 4u)), p.x, p.y);
}

// q4_0: 18 bytes = f16 d, 16 bytes of nibbles (low: elements 0..15, high: 16..31), value d*(q-8)
fn item_q4_0(rb: u32, i: u32) -> Item {
  let p = pos_q4(i);
  let base = rb + (i / 4u) * 18u;
  let d = half_at(base);
  let q = word_at(base + 2u + (i % 4u) * 4u);
  return Item(d * (ubytes(q & 0x0f0f0f0fu) - 8.0), d * (ubytes((q >> 4u) & 0x0f0f0f0fu) - 8.0), p.x, p.y);
}

// q4_1: 20 bytes = f16 d, f16 m, 16 bytes of nibbles, value d*q + m
fn item_q4_1(rb: u32, i: u32) -> Item {
  let p = pos_q4(i);
  let base = rb + (i / 4u) * 20u;
  let dm = unpack2x16float(word_at(base));
  let q = word_at(base + 4u + (i % 4u) * 4u);
  return Item(dm.x * ubytes(q & 0x0f0f0f0fu) + dm.y, dm.x * ubytes((q >> 4u) & 0x0f0f0f0fu) + dm.y, p.x, p.y);
}

// q5_0: 22 bytes = f16 d, 32 high bits (u32, bit j for element j), 16 bytes of low nibbles,
// value d*(q-16)
fn item_q5_0(rb: u32, i: u32) -> Item {
  let p = pos_q4(i);
  let base = rb + (i / 4u) * 22u;
  let d = half_at(base);
  let qh = word_at(base + 2u);
  let t = i % 4u;
  let q = word_at(base + 6u + t * 4u);
  let lo = (q & 0x0f0f0f0fu) | bit4(qh >> (t * 4u));
  let hi = ((q >> 4u) & 0x0f0f0f0fu) | bit4(qh >> (16u + t * 4u));
  return Item(d * (ubytes(lo) - 16.0), d * (ubytes(hi) - 16.0), p.x, p.y);
}

// q5_1: 24 bytes = f16 d, f16 m, 32 high bits (as q5_0), 16 bytes of low nibbles, value d*q + m
fn item_q5_1(rb: u32, i: u32) -> Item {
  let p = pos_q4(i);
  let base = rb + (i / 4u) * 24u;
  let dm = unpack2x16float(word_at(base));
  let qh = word_at(base + 4u);
  let t = i % 4u;
  let q = word_at(base + 8u + t * 4u);
  let lo = (q & 0x0f0f0f0fu) | bit4(qh >> (t * 4u));
  let hi = ((q >> 4u) & 0x0f0f0f0fu) | bit4(qh >> (16u + t * 4u));
  return Item(dm.x * ubytes(lo) + dm.y, dm.x * ubytes(hi) + dm.y, p.x, p.y);
}

// q4_k / q5_k: 6-bit scale and min of sub-block s (0..7) from the 12 scale bytes (words s0 = bytes
// 0..3, s1 = 4..7, s2 = 8..11 of the scale field)
fn kscale(s: u32, s0: u32, s1: u32, s2: u32) -> vec2<f32> {
  if (s < 4u) {
    return vec2<f32>(f32((s0 >> (s * 8u)) & 63u), f32((s1 >> (s * 8u)) & 63u));
  }
  let b = (s - 4u) * 8u;
  let sc = ((s2 >> b) & 0x0fu) | ((((s0 >> b) >> 6u) & 3u) << 4u);
  let mn = (((s2 >> b) >> 4u) & 0x0fu) | ((((s1 >> b) >> 6u) & 3u) << 4u);
  return vec2<f32>(f32(sc), f32(mn));
}

// q4_k: 144 bytes = f16 d, f16 dmin, 12 scale bytes, 128 bytes of nibbles; 8 sub-blocks of 32:
// byte 32c + l holds element l of sub-block 2c (low nibble) and of 2c+1 (high); value
// d*sc*q - dmin*m
// (the scale and minimum of sub-blocks 2c and 2c + 1 of the q4_k / q5_k block at base:
// d * sc, dmin * m of each)
fn k_scales(base: u32, c: u32) -> vec4<f32> {
  let dm = unpack2x16float(word_at(base));
  let s0 = word_at(base + 4u); let s1 = word_at(base + 8u); let s2 = word_at(base + 12u);
  let a = kscale(2u * c, s0, s1, s2);
  let b = kscale(2u * c + 1u, s0, s1, s2);
  return vec4<f32>(dm.x * a.x, dm.y * a.y, dm.x * b.x, dm.y * b.y);
}

fn item_q4_k(rb: u32, i: u32) -> Item {
  let p = pos_k4(i);
  let base = rb + (i / 32u) * 144u;
  let w = i % 32u;
  let k = k_scales(base, w / 8u);
  let q = word_at(base + 16u + w * 4u);
  return Item(k.x * ubytes(q & 0x0f0f0f0fu) - k.y, k.z * ubytes((q >> 4u) & 0x0f0f0f0fu) - k.w, p.x, p.y);
}

// q5_k: 176 bytes = f16 d, f16 dmin, 12 scale bytes, 32 bytes of high bits (bit s of byte l:
// element l of sub-block s), 128 bytes of nibbles as in q4_k
fn item_q5_k(rb: u32, i: u32) -> Item {
  let p = pos_k4(i);
  let base = rb + (i / 32u) * 176u;
  let w = i % 32u;
  let c = w / 8u;
  let k = k_scales(base, c);
  let qh = word_at(base + 16u + (w % 8u) * 4u);
  let q = word_at(base + 48u + w * 4u);
  let lo = (q & 0x0f0f0f0fu) | (((qh >> (2u * c)) & 0x01010101u) << 4u);
  let hi = ((q >> 4u) & 0x0f0f0f0fu) | (((qh >> (2u * c + 1u)) & 0x01010101u) << 4u);
  return Item(k.x * ubytes(lo) - k.y, k.z * ubytes(hi) - k.w, p.x, p.y);
}

// q6_k: 210 bytes = 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales (one per
// 16 elements), f16 d; element 128a + r: low nibble of byte 64a + r % 64 (high nibble when
// r >= 64), high bits (r / 32) of byte 32a + r % 32; value d*scale*(q-32)
fn item_q6_k(rb: u32, i: u32) -> Item {
  let p = pos_q6_k(i);
  let base = rb + (i / 32u) * 210u;
  let w = i % 32u;
  let a = w / 16u;
  let h = (w / 8u) % 2u;
  let l = (w % 8u) * 4u;
  let d = half_at(base + 208u);
  let qa = word_at(base + 64u * a + l);
  let qb = word_at(base + 64u * a + 32u + l);
  let qh = word_at(base + 128u + 32u * a + l);
  let lo = ((qa >> (4u * h)) & 0x0f0f0f0fu) | (((qh >> (4u * h)) & 0x03030303u) << 4u);
  let hi = ((qb >> (4u * h)) & 0x0f0f0f0fu) | (((qh >> (4u * h + 2u)) & 0x03030303u) << 4u);
  let e = p.x % 256u;
  let sa = f32(bitcast<i32>(byte_at(base + 192u + e / 16u) << 24u) >> 24u);
  let sb = f32(bitcast<i32>(byte_at(base + 194u + e / 16u) << 24u) >> 24u);
  return Item(d * sa * (ubytes(lo) - 32.0), d * sb * (ubytes(hi) - 32.0), p.x, p.y);
}

// q3_k: 110 bytes = 32 bytes hmask, 64 bytes of 2-bit quants, 12 scale bytes (16 6-bit scales,
// stored + 32), f16 d; element 128h + 32j + l: bits 2j of byte 32 + 32h + l, high bit 4h + j of
// hmask byte l (clear: minus 4), scale (element / 16); value d*scale*q, q in -4..3. Item i
// (positions as q4_k's) covers chunk c = w / 8 (h = c / 2, j = 2 (c % 2), j + 1 for e + 32).
// scale g: low 4 bits in nibble g / 8 of byte g % 8, top 2 in bits 2 (g / 4) of byte 8 + g % 4
fn q3_scale(base: u32, g: u32) -> f32 {
  let lo = (byte_at(base + 96u + g % 8u) >> (4u * (g / 8u))) & 15u;
  let hi = (byte_at(base + 104u + g % 4u) >> (2u * (g / 4u))) & 3u;
  return f32(i32(lo | (hi << 4u)) - 32);
}
// the 2-bit quants of item i (q3_k, q2_k: 64 bytes of them at qoff in each 256-block of
// nbytes): .q the item's word shifted so that each byte's bits 0-1 are its first four values and
// bits 2-3 the next four; .l its byte offset in the 32-byte group, .c its 8-item chunk
struct K2 { q: u32, l: u32, c: u32, base: u32 }
fn k2_word(rb: u32, i: u32, nbytes: u32, qoff: u32) -> K2 {
  let base = rb + (i / 32u) * nbytes;
  let w = i % 32u;
  let c = w / 8u;
  let l = (w % 8u) * 4u;
  return K2(word_at(base + qoff + 32u * (c / 2u) + l) >> (4u * (c % 2u)), l, c, base);
}
fn item_q3_k(rb: u32, i: u32) -> Item {
  let p = pos_k4(i);
  let k = k2_word(rb, i, 110u, 32u);
  let hm = word_at(k.base + k.l) >> (2u * k.c);
  let lo = (k.q & 0x03030303u) | ((hm & 0x01010101u) << 2u);
  let hi = ((k.q >> 2u) & 0x03030303u) | (((hm >> 1u) & 0x01010101u) << 2u);
  let d = half_at(k.base + 108u);
  let g = (p.x % 256u) / 16u;
  return Item(d * q3_scale(k.base, g) * (ubytes(lo) - 4.0), d * q3_scale(k.base, g + 2u) * (ubytes(hi) - 4.0), p.x, p.y);
}

// q2_k: 84 bytes = 16 scale bytes (low nibble a scale, high nibble a min, for 16 elements each),
// 64 bytes of 2-bit quants (as q3_k's), f16 d, f16 dmin; value d*scale*q - dmin*min
fn item_q2_k(rb: u32, i: u32) -> Item {
  let p = pos_k4(i);
  let k = k2_word(rb, i, 84u, 16u);
  let dm = unpack2x16float(word_at(k.base + 80u));
  let g = (p.x % 256u) / 16u;
  let sa = byte_at(k.base + g);
  let sb = byte_at(k.base + g + 2u);
  return Item(dm.x * f32(sa & 15u) * ubytes(k.q & 0x03030303u) - dm.y * f32(sa >> 4u),
              dm.x * f32(sb & 15u) * ubytes((k.q >> 2u) & 0x03030303u) - dm.y * f32(sb >> 4u), p.x, p.y);
}

// iq4_nl / iq4_xs: a 4-bit index stands for one of 16 int8 values (ggml's kvalues_iq4nl: -127 -104
// -83 -65 -49 -35 -22 -10 1 13 25 38 53 69 89 113), kept as the bytes of four words and cut out
// as the other decoders cut bytes (no array indexed at run time)
fn iq4_value(n: u32) -> f32 {
  let hi = (n & 4u) != 0u;
  let w = select(select(0xbfad9881u, 0xf6eaddcfu, hi), select(0x26190d01u, 0x71594535u, hi), n >= 8u);
  return f32(bitcast<i32>(w << (24u - 8u * (n & 3u))) >> 24u);
}
// the values of the four indices held in the low nibbles of the bytes of w
fn iq4_values(w: u32) -> vec4<f32> {
  return vec4<f32>(iq4_value(w & 15u), iq4_value((w >> 8u) & 15u), iq4_value((w >> 16u) & 15u),
                   iq4_value((w >> 24u) & 15u));
}

// iq4_nl: 18 bytes = f16 d, 16 bytes of indices (as q4_0's nibbles), value d * iq4_value(index)
fn item_iq4_nl(rb: u32, i: u32) -> Item {
  let p = pos_q4(i);
  let base = rb + (i / 4u) * 18u;
  let d = half_at(base);
  let q = word_at(base + 2u + (i % 4u) * 4u);
  return Item(d * iq4_values(q), d * iq4_values(q >> 4u), p.x, p.y);
}

// iq4_xs: 136 bytes = f16 d, u16 scales_h, 4 bytes scales_l, 128 bytes of indices: 8 sub-blocks
// of 32 laid out as iq4_nl blocks (items as q4_0's, 4 per sub-block s), each with the 6-bit scale
// (nibble s % 2 of scales_l[s / 2]) | (bits 2s of scales_h) << 4, stored + 32; value
// d * (scale - 32) * iq4_value(index)
fn item_iq4_xs(rb: u32, i: u32) -> Item {
  let p = pos_q4(i);
  let base = rb + (i / 32u) * 136u;
  let s = (i / 4u) % 8u;
  let h = word_at(base);
  let ls = ((byte_at(base + 4u + s / 2u) >> (4u * (s % 2u))) & 15u) | (((h >> (16u + 2u * s)) & 3u) << 4u);
  let dl = unpack2x16float(h).x * f32(i32(ls) - 32);
  let q = word_at(base + 8u + 16u * s + (i % 4u) * 4u);
  return Item(dl * iq4_values(q), dl * iq4_values(q >> 4u), p.x, p.y);
}

// plain halves / bfloat16 / floats, one element per "block"; a row's last item may pass K
fn flat_elem(rb: u32, e: u32, kind: u32) -> f32 {
  if (e >= u(2u)) { return 0.0; }
  if (kind == 2u) { return bitcast<f32>(wq[(rb >> 2u) + e]); }
  let o = rb + e * 2u;
  let w = wq[o >> 2u];
  let hv = select(w & 0xffffu, w >> 16u, (o & 2u) != 0u);
  if (kind == 1u) { return bitcast<f32>(hv << 16u); }
  return unpack2x16float(hv).x;
}
fn item_flat(rb: u32, i: u32, kind: u32) -> Item {
  let p = pos_flat(i);
  if (p.y + 4u <= u(2u) && kind == 2u) {
    let o = (rb >> 2u) + p.x;
    return Item(vec4<f32>(bitcast<f32>(wq[o]), bitcast<f32>(wq[o + 1u]), bitcast<f32>(wq[o + 2u]), bitcast<f32>(wq[o + 3u])),
                vec4<f32>(bitcast<f32>(wq[o + 4u]), bitcast<f32>(wq[o + 5u]), bitcast<f32>(wq[o + 6u]), bitcast<f32>(wq[o + 7u])),
                p.x, p.y);
  }
  if (p.y + 4u <= u(2u)) {
    let o = rb + p.x * 2u;
    let a = word_at(o); let b = word_at(o + 4u); let c = word_at(o + 8u); let d = word_at(o + 12u);
    if (kind == 1u) {
      return Item(vec4<f32>(bitcast<f32>(a << 16u), bitcast<f32>(a & 0xffff0000u), bitcast<f32>(b << 16u), bitcast<f32>(b & 0xffff0000u)),
                  vec4<f32>(bitcast<f32>(c << 16u), bitcast<f32>(c & 0xffff0000u), bitcast<f32>(d << 16u), bitcast<f32>(d & 0xffff0000u)),
                  p.x, p.y);
    }
    return Item(vec4<f32>(unpack2x16float(a), unpack2x16float(b)), vec4<f32>(unpack2x16float(c), unpack2x16float(d)), p.x, p.y);
  }
  var w0: vec4<f32>;
  var w1: vec4<f32>;
  for (var j = 0u; j < 4u; j = j + 1u) {
    w0[j] = flat_elem(rb, p.x + j, kind);
    w1[j] = flat_elem(rb, p.y + j, kind);
  }
  return Item(w0, w1, p.x, p.y);
}
fn item_f16(rb: u32, i: u32) -> Item { return item_flat(rb, i, 0u); }
fn item_bf16(rb: u32, i: u32) -> Item { return item_flat(rb, i, 1u); }
fn item_f32(rb: u32, i: u32) -> Item { return item_flat(rb, i, 2u); }

fn item(rb: u32, i: u32) -> Item { return item_{{QT}}(rb, i); }
fn item_pos(i: u32) -> vec2<u32> { return {{POS}}(i); }

// item i of weight row `row`, or zeros past the rows (N) or the row's items: their positions
// still say where they lie (info words 3, 4: bytes per row, the weight's byte offset)
fn item_or_zero(row: u32, i: u32, N: u32, nitems: u32) -> Item {
  if (row < N && i < nitems) { return item(u(4u) + row * u(3u), i); }
  let p = item_pos(i);
  return Item(vec4<f32>(0.0), vec4<f32>(0.0), p.x, p.y);
}
