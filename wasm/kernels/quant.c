/* Quantized weights in GGUF block formats: qlinear (x @ dequantize(w)^T), dequantize, qembedding.
 * ember/wasm/ops_quant.py calls these and documents the design; the numbers here (ggml type
 * numbers, the parameter tables, the scratch layout) are mirrored there.
 *
 * qlinear on the integer formats (q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl q2_k q3_k q4_k q5_k q6_k iq4_xs)
 * never expands the weight:
 *  1. each row of x is quantized per block of 32 to int16 (scale dx = amax / 32767, q = round to
 *     nearest even of x * (32767 / amax)), with the float sums of its two halves, into scratch;
 *  2. the weight's 4-to-6-bit (or 8-bit) values become int16 lanes straight from the block bytes
 *     (no byte widening: the 16 bytes of a q4 block, read as 8 int16 lanes, give its 32 nibbles as
 *     four vectors by mask and shift), and i32x4.dot_i16x8_s multiplies them with the activation,
 *     whose int16 values are stored in the matching order: per block of 32
 *     [x0 x2 .. x14 | x1 x3 .. x15 | x16 x18 .. x30 | x17 .. x31];
 *  3. per block, the exact integer sum becomes a float: y += (isum * D) * dx + C * sum(x), where
 *     D is the block's scale and C its offset term (q4_1, q5_1: D = d, C = m; q4_0: C = -8 d; q5_0:
 *     C = -16 d; q8_0, iq4_nl: C = 0; iq4_xs: D = d * sc, C = 0; q4_k/q5_k: D = d * sc,
 *     C = -dmin * m per 32; q6_k: C = -32 D, q3_k: C = -4 D, q2_k: D = d * sc, C = -dmin * m, per 16).
 * Four weight rows are done together: their integer sums are transposed into one vector (a lane
 * per row), so the scales of four rows convert from half precision and accumulate as one vector.
 * The fused path converts the scales without the inf/NaN case and redoes a group of rows exactly
 * when one of its scales had exponent 31 (never, in real weights: 6% of the kernel's time).
 * The int16 activation (not int8, as llama.cpp's q8 activation) costs nothing more here, since
 * the products are int16 x int16 anyway, and keeps the result within ~1e-5 of the float product.
 *
 * Only integer sums are exact; the float operations per block and their order are fixed, so a row
 * of x gives the same bits whichever path (fused or tiled, any M) computes it.
 *
 * (Exported signatures use only ember.h's types: build_kernels.py generates the plan dispatcher
 * from them.)
 *
 * Rules (ember.h): no memory of our own; scratch is Python's. The kernels only read the weight
 * rows they are told about (the touch-ahead reads below are clamped to the weight's last byte). */
#include "ember.h"
#include "team.h"
#include "linalg.h"

typedef unsigned char u8;
typedef short i16;
typedef unsigned short u16;
typedef u16 u16u __attribute__((aligned(1)));
typedef u32 u32u __attribute__((aligned(1)));
typedef i64 i64a __attribute__((aligned(4)));

/* ggml type numbers */
enum { QT_F32 = 0, QT_F16 = 1, QT_Q4_0 = 2, QT_Q4_1 = 3, QT_Q5_0 = 6, QT_Q5_1 = 7, QT_Q8_0 = 8,
       QT_Q2_K = 10, QT_Q3_K = 11, QT_Q4_K = 12, QT_Q5_K = 13, QT_Q6_K = 14, QT_IQ4_NL = 20, QT_IQ4_XS = 23,
       QT_BF16 = 30 };
/* q_linear's parameter table */
enum { QL_QTYPE, QL_M, QL_N, QL_K, QL_NPARAMS };
/* q_embedding's */
enum { QE_QTYPE, QE_COUNT, QE_N, QE_K, QE_IDSIZE, QE_NPARAMS };
/* q_dequantize's */
enum { QD_QTYPE, QD_N, QD_K, QD_NPARAMS };
#define QERR_QTYPE (-1) /* not a format this module knows */
#define QERR_SHAPE (-2) /* k is not a whole number of blocks */

/* whether a format's blocks have an offset term C (q8_0, iq4_nl, iq4_xs: none) */
#define HAS_C(qt) ((qt) != QT_Q8_0 && (qt) != QT_IQ4_NL && (qt) != QT_IQ4_XS)

#define FUSED_MAX_M 3   /* at most this many rows of x: the fused path (else: decoded tiles) */
#define FLOAT_ROWS 32   /* float formats: weight rows expanded to float32 per chunk */
#define AHEAD_GROUPS 2  /* touch-ahead distance of the fused path, in groups of 4 rows */

/* ---- scalars and half precision ------------------------------------------------------------- */

INLINE f32 bits_f32(u32 u) {
  union { u32 u; f32 f; } c;
  c.u = u;
  return c.f;
}

INLINE u32 f32_bits(f32 f) {
  union { u32 u; f32 f; } c;
  c.f = f;
  return c.u;
}

INLINE u32 ld16(const u8 *p) { return *(const u16u *)p; }
INLINE u32 ld32(const u8 *p) { return *(const u32u *)p; }

/* IEEE half -> float, exact for every value (subnormals through the product with 2^112: the
 * exponent field moved to float's place reads 112 too small, and a float subnormal scaled by
 * 2^112 is the half subnormal; exponent 31 (inf, NaN) is mapped explicitly). */
INLINE f32 h2f(u32 h) {
  const u32 em = (h & 0x7FFF) << 13;
  f32 f = bits_f32(em) * 0x1p112f;
  if (em >= 0x0F800000) f = bits_f32(em | 0x7F800000);
  return bits_f32(f32_bits(f) | ((h & 0x8000) << 16));
}

/* the same on four lanes; h: each u32 lane holds a half in its low 16 bits (upper bits zero) */
INLINE f32x4 h2f4(v128_t h) {
  const v128_t em = wasm_v128_and(wasm_i32x4_shl(h, 13), wasm_i32x4_splat(0x0FFFE000));
  const v128_t s = wasm_i32x4_shl(wasm_v128_and(h, wasm_i32x4_splat(0x8000)), 16);
  f32x4 f = wasm_f32x4_mul(em, wasm_f32x4_splat(0x1p112f));
  const v128_t infnan = wasm_i32x4_ge(em, wasm_i32x4_splat(0x0F800000));
  f = wasm_v128_bitselect(wasm_v128_or(em, wasm_i32x4_splat(0x7F800000)), f, infnan);
  return wasm_v128_or(f, s);
}

INLINE f32 hsum4(f32x4 v) {
  v = wasm_f32x4_add(v, wasm_i32x4_shuffle(v, v, 2, 3, 0, 1));
  v = wasm_f32x4_add(v, wasm_i32x4_shuffle(v, v, 1, 0, 3, 2));
  return wasm_f32x4_extract_lane(v, 0);
}

INLINE f32 hmax4(f32x4 v) {   /* NaN wins */
  v = wasm_f32x4_max(v, wasm_i32x4_shuffle(v, v, 2, 3, 0, 1));
  v = wasm_f32x4_max(v, wasm_i32x4_shuffle(v, v, 1, 0, 3, 2));
  return wasm_f32x4_extract_lane(v, 0);
}


/* (each size through an empty asm: clang would make the switch a lookup table, i.e. data, which
 * the module may not have) */
#define OPQ(v) ({ i32 v_ = (v); __asm__("" : "+r"(v_)); v_; })

static i32 q_block(i32 qt) {
  switch (qt) {
    case QT_F32: case QT_F16: case QT_BF16: return OPQ(1);
    case QT_Q4_0: case QT_Q4_1: case QT_Q5_0: case QT_Q5_1: case QT_Q8_0: case QT_IQ4_NL: return OPQ(32);
    case QT_Q2_K: case QT_Q3_K: case QT_Q4_K: case QT_Q5_K: case QT_Q6_K: case QT_IQ4_XS: return OPQ(256);
    default: return 0;
  }
}

static i32 q_nbytes(i32 qt) {
  switch (qt) {
    case QT_F32: return OPQ(4);
    case QT_F16: case QT_BF16: return OPQ(2);
    case QT_Q4_0: return OPQ(18);
    case QT_Q4_1: return OPQ(20);
    case QT_Q5_0: return OPQ(22);
    case QT_Q5_1: return OPQ(24);
    case QT_Q8_0: return OPQ(34);
    case QT_Q2_K: return OPQ(84);
    case QT_Q3_K: return OPQ(110);
    case QT_Q4_K: return OPQ(144);
    case QT_Q5_K: return OPQ(176);
    case QT_Q6_K: return OPQ(210);
    case QT_IQ4_NL: return OPQ(18);
    case QT_IQ4_XS: return OPQ(136);
    default: return 0;
  }
}

/* the 6-bit scale and min of sub-block j of a q4_k/q5_k super-block (12 packed bytes s) */
INLINE void scale_min_k4(i32 j, const u8 *s, i32 *sc, i32 *m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

/* the 16 signed scales of a q3_k block (12 packed bytes s): low 4 bits of scale g in nibble g / 8
 * of byte g % 8, top 2 bits in bits 2 (g / 4) of byte 8 + g % 4, stored offset by 32 */
INLINE i32 scale_q3k(i32 g, const u8 *s) {
  return (i32)(((s[g & 7] >> (4 * (g >> 3))) & 0xF) | (((s[8 + (g & 3)] >> (2 * (g >> 2))) & 3) << 4)) - 32;
}

/* iq4_nl / iq4_xs: a 4-bit index stands for one of 16 int8 values (ggml's kvalues_iq4nl), looked
 * up by one swizzle of a constant vector (an instruction's immediate: the module has no data).
 * 16 bytes of indices (q4_0's nibble order) -> the int8 values of elements 0..15 and 16..31. */
INLINE void iq4_vals(const u8 *q, v128_t *lo, v128_t *hi) {
  const v128_t T = wasm_i8x16_make(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
  const v128_t v = wasm_v128_load(q);
  *lo = wasm_i8x16_swizzle(T, wasm_v128_and(v, wasm_i8x16_splat(0x0F)));
  *hi = wasm_i8x16_swizzle(T, wasm_u8x16_shr(v, 4));
}

/* o[0..16) = d * the 16 int8 values of t (one rounding each, as the scalar product) */
INLINE void iq4_deq16(v128_t t, f32 d, f32 *o) {
  const f32x4 D = wasm_f32x4_splat(d);
  const v128_t l = wasm_i16x8_extend_low_i8x16(t), h = wasm_i16x8_extend_high_i8x16(t);
  wasm_v128_store(o, wasm_f32x4_mul(D, wasm_f32x4_convert_i32x4(wasm_i32x4_extend_low_i16x8(l))));
  wasm_v128_store(o + 4, wasm_f32x4_mul(D, wasm_f32x4_convert_i32x4(wasm_i32x4_extend_high_i16x8(l))));
  wasm_v128_store(o + 8, wasm_f32x4_mul(D, wasm_f32x4_convert_i32x4(wasm_i32x4_extend_low_i16x8(h))));
  wasm_v128_store(o + 12, wasm_f32x4_mul(D, wasm_f32x4_convert_i32x4(wasm_i32x4_extend_high_i16x8(h))));
}

/* the iq4_xs sub-block s's scale (6 bits, stored + 32) */
INLINE i32 scale_iq4xs(i32 s, const u8 *p) {
  return (i32)(((p[4 + (s >> 1)] >> (4 * (s & 1))) & 0xF) | (((ld16(p + 2) >> (2 * s)) & 3) << 4)) - 32;
}

/* ---- dequantize: one row of k elements, natural order ------------------------------------------
 * Bit-equal to gguf.quants.dequantize (and to ember.quant's reference): every value is one
 * rounding of its exact value (the products before the last operation are exact in float32). */

static void deq_row(i32 qt, const u8 *w, f32 *o, i32 k) {
  switch (qt) {
    case QT_F32:
      for (i32 i = 0; i < k; i++) o[i] = bits_f32(ld32(w + 4 * i));
      return;
    case QT_F16: {
      i32 i = 0;
      for (; i + 8 <= k; i += 8) {
        const v128_t h = wasm_v128_load(w + 2 * i);
        wasm_v128_store(o + i, h2f4(wasm_u32x4_extend_low_u16x8(h)));
        wasm_v128_store(o + i + 4, h2f4(wasm_u32x4_extend_high_u16x8(h)));
      }
      for (; i < k; i++) o[i] = h2f(ld16(w + 2 * i));
      return;
    }
    case QT_BF16:
      for (i32 i = 0; i < k; i++) o[i] = bits_f32(ld16(w + 2 * i) << 16);
      return;
    default: break;
  }
  const i32 nbytes = q_nbytes(qt);
  for (i32 b = 0; b < k / q_block(qt); b++) {
    const u8 *p = w + b * nbytes;
    switch (qt) {
      case QT_Q8_0: {
        const f32 d = h2f(ld16(p));
        for (i32 i = 0; i < 32; i++) o[i] = (f32)(signed char)p[2 + i] * d;
        o += 32;
        break;
      }
      case QT_Q4_0: {
        const f32 d = h2f(ld16(p));
        for (i32 i = 0; i < 16; i++) {
          o[i] = d * (f32)((p[2 + i] & 0xF) - 8);
          o[i + 16] = d * (f32)((p[2 + i] >> 4) - 8);
        }
        o += 32;
        break;
      }
      case QT_Q4_1: {
        const f32 d = h2f(ld16(p)), m = h2f(ld16(p + 2));
        for (i32 i = 0; i < 16; i++) {
          o[i] = d * (f32)(p[4 + i] & 0xF) + m;
          o[i + 16] = d * (f32)(p[4 + i] >> 4) + m;
        }
        o += 32;
        break;
      }
      case QT_Q5_0: {
        const f32 d = h2f(ld16(p));
        const u32 qh = ld32(p + 2);
        for (i32 i = 0; i < 16; i++) {
          o[i] = d * (f32)((i32)((p[6 + i] & 0xF) | (((qh >> i) & 1) << 4)) - 16);
          o[i + 16] = d * (f32)((i32)((p[6 + i] >> 4) | (((qh >> (i + 16)) & 1) << 4)) - 16);
        }
        o += 32;
        break;
      }
      case QT_Q5_1: {
        const f32 d = h2f(ld16(p)), m = h2f(ld16(p + 2));
        const u32 qh = ld32(p + 4);
        for (i32 i = 0; i < 16; i++) {
          o[i] = d * (f32)((p[8 + i] & 0xF) | (((qh >> i) & 1) << 4)) + m;
          o[i + 16] = d * (f32)((p[8 + i] >> 4) | (((qh >> (i + 16)) & 1) << 4)) + m;
        }
        o += 32;
        break;
      }
      case QT_IQ4_NL: {
        v128_t lo, hi;
        const f32 d = h2f(ld16(p));
        iq4_vals(p + 2, &lo, &hi);
        iq4_deq16(lo, d, o);
        iq4_deq16(hi, d, o + 16);
        o += 32;
        break;
      }
      case QT_IQ4_XS: {
        const f32 d = h2f(ld16(p));
        for (i32 s = 0; s < 8; s++) {
          v128_t lo, hi;
          const f32 dl = d * (f32)scale_iq4xs(s, p);
          iq4_vals(p + 8 + 16 * s, &lo, &hi);
          iq4_deq16(lo, dl, o + 32 * s);
          iq4_deq16(hi, dl, o + 32 * s + 16);
        }
        o += 256;
        break;
      }
      case QT_Q4_K: case QT_Q5_K: {
        const f32 d = h2f(ld16(p)), dmin = h2f(ld16(p + 2));
        const u8 *sc = p + 4, *qh = p + 16, *qs = p + (qt == QT_Q4_K ? 16 : 48);
        for (i32 j = 0; j < 8; j++) {
          i32 s, m;
          scale_min_k4(j, sc, &s, &m);
          const f32 dl = d * (f32)s, ml = dmin * (f32)m;
          const u8 *q = qs + 32 * (j >> 1);
          const i32 sh = 4 * (j & 1);
          for (i32 l = 0; l < 32; l++) {
            i32 v = (q[l] >> sh) & 0xF;
            if (qt == QT_Q5_K) v |= ((qh[l] >> j) & 1) << 4;
            o[32 * j + l] = dl * (f32)v - ml;
          }
        }
        o += 256;
        break;
      }
      case QT_Q2_K: {
        /* element 32i + l (i = 4h + j): bits 2j of qs[32h + l]; scale byte 2i + l / 16: low
         * nibble the scale, high nibble the min */
        const u8 *sc = p, *qs = p + 16;
        const f32 d = h2f(ld16(p + 80)), dmin = h2f(ld16(p + 82));
        for (i32 i = 0; i < 8; i++) {
          const u8 *q = qs + 32 * (i >> 2);
          const i32 sh = 2 * (i & 3);
          for (i32 l = 0; l < 32; l++) {
            const i32 s = sc[2 * i + (l >> 4)];
            const f32 dl = d * (f32)(s & 0xF), ml = dmin * (f32)(s >> 4);
            o[32 * i + l] = dl * (f32)((q[l] >> sh) & 3) - ml;
          }
        }
        o += 256;
        break;
      }
      case QT_Q3_K: {
        /* element 32i + l (i = 4h + j): bits 2j of qs[32h + l], high bit i of hmask[l] (clear:
         * minus 4), scale 2i + l / 16 */
        const u8 *hm = p, *qs = p + 32, *sc = p + 96;
        const f32 d = h2f(ld16(p + 108));
        for (i32 i = 0; i < 8; i++) {
          const u8 *q = qs + 32 * (i >> 2);
          const i32 sh = 2 * (i & 3);
          for (i32 l = 0; l < 32; l++) {
            const i32 v = (i32)(((q[l] >> sh) & 3) | (((hm[l] >> i) & 1) << 2)) - 4;
            const f32 dl = d * (f32)scale_q3k(2 * i + (l >> 4), sc);
            o[32 * i + l] = dl * (f32)v;
          }
        }
        o += 256;
        break;
      }
      case QT_Q6_K: {
        const u8 *ql = p, *qh = p + 128;
        const signed char *sc = (const signed char *)(p + 192);
        const f32 d = h2f(ld16(p + 208));
        for (i32 c = 0; c < 2; c++) {
          for (i32 g = 0; g < 4; g++) {
            const u8 *q = ql + 64 * c + 32 * (g & 1);
            const i32 sh = 4 * (g >> 1);
            for (i32 l = 0; l < 32; l++) {
              const i32 v = (((q[l] >> sh) & 0xF) | (((qh[32 * c + l] >> (2 * g)) & 3) << 4)) - 32;
              const f32 dl = d * (f32)sc[8 * c + 2 * g + (l >> 4)];
              o[128 * c + 32 * g + l] = dl * (f32)v;
            }
          }
        }
        o += 256;
        break;
      }
      default: return;
    }
  }
}

/* n rows of k elements of w -> out (n * k floats). Returns 0, QERR_QTYPE or QERR_SHAPE. */
EXPORT(q_dequantize) i32 q_dequantize(const void *wv, f32 *out, const i32 *prm) {
  const u8 *w = (const u8 *)wv;
  const i32 qt = prm[QD_QTYPE], n = prm[QD_N], k = prm[QD_K], blk = q_block(qt);
  if (!blk) return QERR_QTYPE;
  if (k % blk) return QERR_SHAPE;
  const i32 rb = k / blk * q_nbytes(qt);
  for (i32 r = 0; r < n; r++) deq_row(qt, w + r * rb, out + r * k, k);
  return 0;
}

/* out[i] = row ids[i] of the (n, k) weight, for count ids (idsize 4: int32, 8: int64). Every id
 * is checked before anything is written: returns i + 1 for the first id outside [0, n). */
EXPORT(q_embedding) i32 q_embedding(const void *wv, const void *ids, f32 *out, const i32 *prm) {
  const u8 *w = (const u8 *)wv;
  const i32 qt = prm[QE_QTYPE], count = prm[QE_COUNT], n = prm[QE_N], k = prm[QE_K], wide = prm[QE_IDSIZE] == 8;
  const i32 blk = q_block(qt);
  if (!blk) return QERR_QTYPE;
  if (k % blk) return QERR_SHAPE;
  const i32 rb = k / blk * q_nbytes(qt);
  for (i32 i = 0; i < count; i++) {
    const i64 id = wide ? ((const i64a *)ids)[i] : (i64)((const i32 *)ids)[i];
    if (id < 0 || id >= n) return i + 1;
  }
  for (i32 i = 0; i < count; i++) {
    const i32 id = wide ? (i32)((const i64a *)ids)[i] : ((const i32 *)ids)[i];
    deq_row(qt, w + id * rb, out + i * k, k);
  }
  return 0;
}

/* ---- the activation: int16 per block of 32 -------------------------------------------------- */

INLINE v128_t quant8(f32x4 a, f32x4 b, f32x4 id) {
  const v128_t qa = wasm_i32x4_trunc_sat_f32x4(wasm_f32x4_nearest(wasm_f32x4_mul(a, id)));
  const v128_t qb = wasm_i32x4_trunc_sat_f32x4(wasm_f32x4_nearest(wasm_f32x4_mul(b, id)));
  return wasm_i16x8_narrow_i32x4(qa, qb);
}

/* One row of K floats -> xq (K int16 in the dot order above) and xs (4 floats per block: dx,
 * the sums of x over the block's first and second 16, and over all 32). A block holding inf or
 * NaN gets dx = NaN (its q are 0): every output it feeds comes out NaN. */
static void quantize_row(const f32 *x, i32 K, i16 *xq, f32 *xs) {
  for (i32 b = 0; b < K / 32; b++) {
    const f32 *p = x + 32 * b;
    const f32x4 v0 = wasm_v128_load(p), v1 = wasm_v128_load(p + 4), v2 = wasm_v128_load(p + 8);
    const f32x4 v3 = wasm_v128_load(p + 12), v4 = wasm_v128_load(p + 16), v5 = wasm_v128_load(p + 20);
    const f32x4 v6 = wasm_v128_load(p + 24), v7 = wasm_v128_load(p + 28);
    const f32x4 m = wasm_f32x4_max(
        wasm_f32x4_max(wasm_f32x4_max(wasm_f32x4_abs(v0), wasm_f32x4_abs(v1)),
                       wasm_f32x4_max(wasm_f32x4_abs(v2), wasm_f32x4_abs(v3))),
        wasm_f32x4_max(wasm_f32x4_max(wasm_f32x4_abs(v4), wasm_f32x4_abs(v5)),
                       wasm_f32x4_max(wasm_f32x4_abs(v6), wasm_f32x4_abs(v7))));
    const f32 a = hmax4(m);
    const f32 s0 = hsum4(wasm_f32x4_add(wasm_f32x4_add(v0, v1), wasm_f32x4_add(v2, v3)));
    const f32 s1 = hsum4(wasm_f32x4_add(wasm_f32x4_add(v4, v5), wasm_f32x4_add(v6, v7)));
    f32 d = 0.f, id = 0.f;
    if (a <= 3.40282347e38f) {
      if (a > 0.f) {
        d = a / 32767.f;
        id = 32767.f / a;
      }
    } else {
      d = __builtin_nanf("");
    }
    const f32x4 vid = wasm_f32x4_splat(id);
    const v128_t q0 = quant8(v0, v1, vid), q1 = quant8(v2, v3, vid);
    const v128_t q2 = quant8(v4, v5, vid), q3 = quant8(v6, v7, vid);
    i16 *o = xq + 32 * b;
    wasm_v128_store(o, wasm_i16x8_shuffle(q0, q1, 0, 2, 4, 6, 8, 10, 12, 14));
    wasm_v128_store(o + 8, wasm_i16x8_shuffle(q0, q1, 1, 3, 5, 7, 9, 11, 13, 15));
    wasm_v128_store(o + 16, wasm_i16x8_shuffle(q2, q3, 0, 2, 4, 6, 8, 10, 12, 14));
    wasm_v128_store(o + 24, wasm_i16x8_shuffle(q2, q3, 1, 3, 5, 7, 9, 11, 13, 15));
    f32 *s = xs + 4 * b;
    s[0] = d;
    s[1] = s0;
    s[2] = s1;
    s[3] = s0 + s1;
  }
}

/* ---- weight blocks as int16 lanes ------------------------------------------------------------ */

/* 16 bytes of nibbles (byte i: element i low, element i + 16 high) as the four vectors of the
 * dot order: elements 0 2 .. 14, 1 3 .. 15, 16 18 .. 30, 17 .. 31 (each 0..15) */
INLINE void nib4(v128_t v, v128_t *a, v128_t *b, v128_t *c, v128_t *d) {
  const v128_t m = wasm_i16x8_splat(0x0F);
  *a = wasm_v128_and(v, m);
  *b = wasm_v128_and(wasm_u16x8_shr(v, 8), m);
  *c = wasm_v128_and(wasm_u16x8_shr(v, 4), m);
  *d = wasm_u16x8_shr(v, 12);
}

/* q5_0's fifth bits: bit i of qh belongs to element i. Lanes of a/b/c/d get 16 where it is set. */
INLINE void q5_high(u32 qh, v128_t *a, v128_t *b, v128_t *c, v128_t *d) {
  const v128_t ma = wasm_i16x8_make(1, 4, 16, 64, 256, 1024, 4096, 16384);
  const v128_t mb = wasm_i16x8_make(2, 8, 32, 128, 512, 2048, 8192, (i16)0x8000);
  const v128_t lo = wasm_i16x8_splat((i16)(qh & 0xFFFF)), hi = wasm_i16x8_splat((i16)(qh >> 16));
  const v128_t sixteen = wasm_i16x8_splat(16);
#define Q5BIT(v, h, msk) *v = wasm_v128_or(*v, wasm_v128_and(wasm_i16x8_eq(wasm_v128_and(h, msk), msk), sixteen));
  Q5BIT(a, lo, ma) Q5BIT(b, lo, mb) Q5BIT(c, hi, ma) Q5BIT(d, hi, mb)
#undef Q5BIT
}

/* 32 int8 (q8_0) as int16 in the dot order: the even bytes by shifting up and back (sign
 * extended), the odd ones by an arithmetic shift */
INLINE void q8_4(const u8 *q, v128_t *a, v128_t *b, v128_t *c, v128_t *d) {
  const v128_t u = wasm_v128_load(q), v = wasm_v128_load(q + 16);
  *a = wasm_i16x8_shr(wasm_i16x8_shl(u, 8), 8);
  *b = wasm_i16x8_shr(u, 8);
  *c = wasm_i16x8_shr(wasm_i16x8_shl(v, 8), 8);
  *d = wasm_i16x8_shr(v, 8);
}

/* 16 bytes of 4-bit indices (as q4_0's nibbles) -> their iq4 values as int16 in the dot order:
 * the table lookup (iq4_vals), then q8_4's widening */
INLINE void iq4_4(const u8 *q, v128_t *a, v128_t *b, v128_t *c, v128_t *d) {
  v128_t lo, hi;
  iq4_vals(q, &lo, &hi);
  *a = wasm_i16x8_shr(wasm_i16x8_shl(lo, 8), 8);
  *b = wasm_i16x8_shr(lo, 8);
  *c = wasm_i16x8_shr(wasm_i16x8_shl(hi, 8), 8);
  *d = wasm_i16x8_shr(hi, 8);
}

/* a block of the simple formats as the four int16 vectors */
INLINE void block_lanes(const i32 QT, const u8 *p, v128_t *a, v128_t *b, v128_t *c, v128_t *d) {
  if (QT == QT_Q8_0) {
    q8_4(p + 2, a, b, c, d);
    return;
  }
  if (QT == QT_IQ4_NL) {
    iq4_4(p + 2, a, b, c, d);
    return;
  }
  nib4(wasm_v128_load(p + (QT == QT_Q4_0 ? 2 : QT == QT_Q4_1 ? 4 : QT == QT_Q5_0 ? 6 : 8)), a, b, c, d);
  if (QT == QT_Q5_0) q5_high(ld32(p + 2), a, b, c, d);
  if (QT == QT_Q5_1) q5_high(ld32(p + 4), a, b, c, d);
}

INLINE v128_t dot4(v128_t a, v128_t b, v128_t c, v128_t d, v128_t X0, v128_t X1, v128_t X2, v128_t X3) {
  v128_t p = wasm_i32x4_dot_i16x8(a, X0);
  p = wasm_i32x4_add(p, wasm_i32x4_dot_i16x8(b, X1));
  p = wasm_i32x4_add(p, wasm_i32x4_dot_i16x8(c, X2));
  return wasm_i32x4_add(p, wasm_i32x4_dot_i16x8(d, X3));
}

/* [sum a, sum b, sum c, sum d] of four i32x4 */
INLINE v128_t reduce4(v128_t a, v128_t b, v128_t c, v128_t d) {
  const v128_t ab = wasm_i32x4_add(wasm_i32x4_shuffle(a, b, 0, 4, 1, 5), wasm_i32x4_shuffle(a, b, 2, 6, 3, 7));
  const v128_t cd = wasm_i32x4_add(wasm_i32x4_shuffle(c, d, 0, 4, 1, 5), wasm_i32x4_shuffle(c, d, 2, 6, 3, 7));
  return wasm_i32x4_add(wasm_i64x2_shuffle(ab, cd, 0, 2), wasm_i64x2_shuffle(ab, cd, 1, 3));
}

/* D and C (see the top) of block o of four rows, a lane per row */
INLINE void block_scales(const i32 QT, const u8 *p0, const u8 *p1, const u8 *p2, const u8 *p3, f32x4 *D,
                         f32x4 *C) {
  if (QT == QT_Q4_1 || QT == QT_Q5_1) {
    v128_t dm = wasm_v128_load32_zero(p0);
    dm = wasm_v128_load32_lane(p1, dm, 1);
    dm = wasm_v128_load32_lane(p2, dm, 2);
    dm = wasm_v128_load32_lane(p3, dm, 3);
    *D = h2f4(wasm_v128_and(dm, wasm_i32x4_splat(0xFFFF)));
    *C = h2f4(wasm_u32x4_shr(dm, 16));
    return;
  }
  v128_t h = wasm_v128_load16_lane(p0, wasm_i32x4_splat(0), 0);
  h = wasm_v128_load16_lane(p1, h, 2);
  h = wasm_v128_load16_lane(p2, h, 4);
  h = wasm_v128_load16_lane(p3, h, 6);
  *D = h2f4(h);
  if (QT == QT_Q4_0) *C = wasm_f32x4_mul(*D, wasm_f32x4_splat(-8.f));
  else if (QT == QT_Q5_0) *C = wasm_f32x4_mul(*D, wasm_f32x4_splat(-16.f));
  else *C = wasm_f32x4_splat(0.f);
}

/* The fast conversion, of halves held in the upper 16 bits of 32-bit lanes (the lower 16 bits
 * may hold anything): an arithmetic shift right by 3 moves exponent and mantissa to float's
 * places (bits 13..27) and copies the sign into bits 28..31; the sign and bits 13..27 kept, the
 * product with 2^112 (exact) is the half's value, subnormals and signed zeros included, the same
 * bits as h2f4. Exponent 31 (inf, NaN) comes out finite and wrong: callers keep the u16 maximum
 * of the exponent fields (H_EXP) and redo a group where it reached 0x7C00 (h_bad). */
#define H_EXP 0x7C00
INLINE f32x4 h2f4_hi(v128_t hi) {
  return wasm_f32x4_mul(wasm_v128_and(wasm_i32x4_shr(hi, 3), wasm_i32x4_splat((i32)0x8FFFE000)), wasm_f32x4_splat(0x1p112f));
}
INLINE v128_t h_exp_max(v128_t bad, v128_t h) { return wasm_u16x8_max(bad, wasm_v128_and(h, wasm_i16x8_splat(H_EXP))); }
INLINE i32 h_bad(v128_t bad) { return wasm_v128_any_true(wasm_i16x8_eq(bad, wasm_i16x8_splat(H_EXP))); }

INLINE void block_scales_fast(const i32 QT, const u8 *p0, const u8 *p1, const u8 *p2, const u8 *p3, f32x4 *D,
                              f32x4 *C, v128_t *bad) {
  if (QT == QT_Q4_1 || QT == QT_Q5_1) {
    v128_t dm = wasm_v128_load32_zero(p0);   /* d in the low 16 bits of a lane, m in the high */
    dm = wasm_v128_load32_lane(p1, dm, 1);
    dm = wasm_v128_load32_lane(p2, dm, 2);
    dm = wasm_v128_load32_lane(p3, dm, 3);
    *bad = h_exp_max(*bad, dm);
    *D = h2f4_hi(wasm_i32x4_shl(dm, 16));
    *C = h2f4_hi(dm);
    return;
  }
  v128_t h = wasm_v128_load16_lane(p0, wasm_i32x4_splat(0), 1);   /* each half in a lane's high 16 bits */
  h = wasm_v128_load16_lane(p1, h, 3);
  h = wasm_v128_load16_lane(p2, h, 5);
  h = wasm_v128_load16_lane(p3, h, 7);
  *bad = h_exp_max(*bad, h);
  *D = h2f4_hi(h);
  if (QT == QT_Q4_0) *C = wasm_f32x4_mul(*D, wasm_f32x4_splat(-8.f));
  else if (QT == QT_Q5_0) *C = wasm_f32x4_mul(*D, wasm_f32x4_splat(-16.f));
  else *C = wasm_f32x4_splat(0.f);
}

/* store lanes 0..nr-1 */
INLINE void store_rows(f32 *y, f32x4 v, i32 nr) {
  if (nr == 4) {
    wasm_v128_store(y, v);
    return;
  }
  y[0] = wasm_f32x4_extract_lane(v, 0);
  if (nr > 1) y[1] = wasm_f32x4_extract_lane(v, 1);
  if (nr > 2) y[2] = wasm_f32x4_extract_lane(v, 2);
}

/* ---- the fused path: one row of x against the simple formats -------------------------------- */

/* y[0..N) = W (N rows of nb blocks) . x, x quantized as (xq, xs). Reads a byte of the weight some
 * rows ahead per block (clamped to its last byte): V8 issues no prefetch, and without these the
 * hardware ran a multi-megabyte weight at a third of the memory's speed. The bytes are folded
 * into *touch so that the loads stay. */
/* The activation block's four vectors for each weight row. Meant as a reload per row (an empty
 * asm making the pointer opaque), but clang merges the four non-volatile asm statements (same
 * input) and the loads with them: the emitted code loads the vectors at the first row and keeps
 * them in locals across the four (seen in the .s, 2026-12-06). With this block's scale code,
 * that is faster than real reloads (asm volatile: the model's q_linears 12.4 -> 15.4 ms per
 * token, Node 20) and than the same loads written as plain locals at the top of the block
 * (within noise, slower). Kept as it is; the macro only fixes where clang places the loads. */
#define X_RELOAD(r)                                                                                \
  ({ const i16 *xr_ = xb; __asm__("" : "+r"(xr_)); wasm_v128_load(xr_); }),                        \
  ({ const i16 *xr_ = xb; __asm__("" : "+r"(xr_)); wasm_v128_load(xr_ + 8); }),                    \
  ({ const i16 *xr_ = xb; __asm__("" : "+r"(xr_)); wasm_v128_load(xr_ + 16); }),                   \
  ({ const i16 *xr_ = xb; __asm__("" : "+r"(xr_)); wasm_v128_load(xr_ + 24); })

/* block bytes of the fused path's formats (a constant where QT is) */
INLINE i32 fused_bytes(const i32 QT) {
  return QT == QT_Q4_0 || QT == QT_IQ4_NL ? 18 : QT == QT_Q4_1 ? 20 : QT == QT_Q5_0 ? 22 : QT == QT_Q5_1 ? 24 : 34;
}

/* rows n..n+nr-1 (nr <= 4) of W . x; returns nonzero when the fast half conversion met an inf/NaN
 * scale (EXACT = 0), in which case the caller redoes the group with EXACT = 1 */
INLINE i32 fused_group(const i32 QT, const i32 EXACT, const u8 *w, i32 rb, i32 n, i32 nr, i32 nb, const i16 *xq,
                       const f32 *xs, f32 *y, u32 ahead, i32 *touch) {
  const i32 bs = fused_bytes(QT);
  const u8 *w0 = w + n * rb;
  const u8 *w1 = nr > 1 ? w0 + rb : w0, *w2 = nr > 2 ? w1 + rb : w1, *w3 = nr > 3 ? w2 + rb : w2;
  f32x4 acc = wasm_f32x4_splat(0.f), accm = acc;
  v128_t bad = wasm_i32x4_splat(0);
  i32 t = 0;
  for (i32 b = 0; b < nb; b++) {
    const i32 o = b * bs;
    if (!EXACT) {   /* (fused_rows keeps these inside the weight) */
      const u32 a = ahead + 4 * (u32)o;
      t ^= w[a];
      t ^= w[a + 64];
      if (bs > 32) t ^= w[a + 128];
    }
    const i16 *xb = xq + 32 * b;
    v128_t qa, qb, qc, qd;
    block_lanes(QT, w0 + o, &qa, &qb, &qc, &qd);
    const v128_t p0 = dot4(qa, qb, qc, qd, X_RELOAD(0));
    block_lanes(QT, w1 + o, &qa, &qb, &qc, &qd);
    const v128_t p1 = dot4(qa, qb, qc, qd, X_RELOAD(1));
    block_lanes(QT, w2 + o, &qa, &qb, &qc, &qd);
    const v128_t p2 = dot4(qa, qb, qc, qd, X_RELOAD(2));
    block_lanes(QT, w3 + o, &qa, &qb, &qc, &qd);
    const v128_t p3 = dot4(qa, qb, qc, qd, X_RELOAD(3));
    f32x4 D, C;
    if (EXACT) block_scales(QT, w0 + o, w1 + o, w2 + o, w3 + o, &D, &C);
    else block_scales_fast(QT, w0 + o, w1 + o, w2 + o, w3 + o, &D, &C, &bad);
    const f32x4 P = wasm_f32x4_convert_i32x4(reduce4(p0, p1, p2, p3));
    acc = wasm_f32x4_add(acc, wasm_f32x4_mul(wasm_f32x4_mul(P, D), wasm_v128_load32_splat(xs + 4 * b)));
    if (HAS_C(QT)) accm = wasm_f32x4_add(accm, wasm_f32x4_mul(C, wasm_v128_load32_splat(xs + 4 * b + 3)));
  }
  *touch ^= t;
  if (!EXACT && h_bad(bad)) return 1;
  store_rows(y + n, HAS_C(QT) ? wasm_f32x4_add(acc, accm) : acc, nr);
  return 0;
}

INLINE void fused_rows(const i32 QT, const u8 *w, i32 N, i32 nb, const i16 *xq, const f32 *xs, f32 *y,
                       i32 *touch) {
  const i32 bs = fused_bytes(QT);
  const i32 rb = nb * bs;
  /* the touches of a group reach less than 4 rows + 128 bytes past `ahead` (offsets, not
   * pointers: nothing past the weight is formed); a weight smaller than that is read exactly,
   * without them */
  const u32 total = (u32)(N * rb), span = 4 * (u32)rb + 128;
  const i32 tiny = total <= span;
  for (i32 n = 0; n < N; n += 4) {
    const i32 nr = N - n < 4 ? N - n : 4;
    u32 ahead = (u32)((n + 4 * AHEAD_GROUPS) * rb);
    if (!tiny && ahead > total - span) ahead = total - span;
    if (tiny || fused_group(QT, 0, w, rb, n, nr, nb, xq, xs, y, ahead, touch))
      fused_group(QT, 1, w, rb, n, nr, nb, xq, xs, y, ahead, touch);
  }
}

static void fused(i32 qt, const u8 *w, i32 N, i32 nb, const i16 *xq, const f32 *xs, f32 *y, i32 *touch) {
  switch (qt) {
    case QT_Q4_0: fused_rows(QT_Q4_0, w, N, nb, xq, xs, y, touch); break;
    case QT_Q4_1: fused_rows(QT_Q4_1, w, N, nb, xq, xs, y, touch); break;
    case QT_Q5_0: fused_rows(QT_Q5_0, w, N, nb, xq, xs, y, touch); break;
    case QT_Q5_1: fused_rows(QT_Q5_1, w, N, nb, xq, xs, y, touch); break;
    case QT_IQ4_NL: fused_rows(QT_IQ4_NL, w, N, nb, xq, xs, y, touch); break;
    default: fused_rows(QT_Q8_0, w, N, nb, xq, xs, y, touch); break;
  }
}

/* ---- the fused path for q4_k -------------------------------------------------------------------
 * Per super-block of four rows, the scales are unpacked with scalar code into sc (floats, a lane
 * per row: D[8][4] then C[8][4]); the nibbles go from the block bytes to int16 lanes and into the
 * dot products without a store, as in fused_rows. Same float operations in the same order as the
 * tiled path. (q5_k and q6_k written this way ran slower than their tiles: 4.9 and 4.3 against
 * 5.4 and 6.2 GMAC/s, 1536 x 512 in cache; they keep the tiles.) */

INLINE void q4k_scales(const u8 *p, i32 r, f32 *sc) {
  const f32 dd = h2f(ld16(p)), dmin = h2f(ld16(p + 2));
  for (i32 j = 0; j < 8; j++) {
    i32 s, mn;
    scale_min_k4(j, p + 4, &s, &mn);
    sc[4 * j + r] = dd * (f32)s;
    sc[32 + 4 * j + r] = -(dmin * (f32)mn);
  }
}

/* sub-block j of a q4_k super-block p as the four int16 vectors of the dot order */
INLINE void q4k_lanes(const u8 *p, i32 j, v128_t *a, v128_t *b, v128_t *c, v128_t *d) {
  const v128_t m = wasm_i16x8_splat(0x0F);
  const u8 *qs = p + 16 + 32 * (j >> 1);
  const i32 sh = 4 * (j & 1);
  const v128_t u0 = wasm_u16x8_shr(wasm_v128_load(qs), sh), u1 = wasm_u16x8_shr(wasm_v128_load(qs + 16), sh);
  *a = wasm_v128_and(u0, m);
  *b = wasm_v128_and(wasm_u16x8_shr(u0, 8), m);
  *c = wasm_v128_and(u1, m);
  *d = wasm_v128_and(wasm_u16x8_shr(u1, 8), m);
}

static void q4k_fused(const u8 *w, i32 N, i32 nb, const i16 *xq, const f32 *xs, f32 *y, f32 *sc, i32 *touch) {
  const i32 bs = 144, nsb = nb / 8, rb = nsb * bs;
  const u32 last = (u32)(N * rb) - 1;
  i32 t = 0;
  for (i32 n = 0; n < N; n += 4) {
    const i32 nr = N - n < 4 ? N - n : 4;
    const u8 *w0 = w + n * rb;
    const u8 *w1 = nr > 1 ? w0 + rb : w0, *w2 = nr > 2 ? w1 + rb : w1, *w3 = nr > 3 ? w2 + rb : w2;
    const u32 ahead = (u32)((n + 4 * AHEAD_GROUPS) * rb);
    f32x4 acc = wasm_f32x4_splat(0.f), accm = acc;
    for (i32 sb = 0; sb < nsb; sb++) {
      const i32 o = sb * bs;
      for (u32 a = ahead + 4 * (u32)o; a < ahead + 4 * (u32)(o + bs); a += 64) t ^= w[a < last ? a : last];
      q4k_scales(w0 + o, 0, sc);
      q4k_scales(w1 + o, 1, sc);
      q4k_scales(w2 + o, 2, sc);
      q4k_scales(w3 + o, 3, sc);
      for (i32 j = 0; j < 8; j++) {
        const i32 k = 8 * sb + j;
        const i16 *xb = xq + 32 * k;
        const v128_t X0 = wasm_v128_load(xb), X1 = wasm_v128_load(xb + 8);
        const v128_t X2 = wasm_v128_load(xb + 16), X3 = wasm_v128_load(xb + 24);
        v128_t qa, qb, qc, qd;
        q4k_lanes(w0 + o, j, &qa, &qb, &qc, &qd);
        const v128_t p0 = dot4(qa, qb, qc, qd, X0, X1, X2, X3);
        q4k_lanes(w1 + o, j, &qa, &qb, &qc, &qd);
        const v128_t p1 = dot4(qa, qb, qc, qd, X0, X1, X2, X3);
        q4k_lanes(w2 + o, j, &qa, &qb, &qc, &qd);
        const v128_t p2 = dot4(qa, qb, qc, qd, X0, X1, X2, X3);
        q4k_lanes(w3 + o, j, &qa, &qb, &qc, &qd);
        const v128_t p3 = dot4(qa, qb, qc, qd, X0, X1, X2, X3);
        const f32x4 P = wasm_f32x4_convert_i32x4(reduce4(p0, p1, p2, p3));
        acc = wasm_f32x4_add(acc, wasm_f32x4_mul(wasm_f32x4_mul(P, wasm_v128_load(sc + 4 * j)),
                                                 wasm_v128_load32_splat(xs + 4 * k)));
        accm = wasm_f32x4_add(accm, wasm_f32x4_mul(wasm_v128_load(sc + 32 + 4 * j), wasm_v128_load32_splat(xs + 4 * k + 3)));
      }
    }
    store_rows(y + n, wasm_f32x4_add(acc, accm), nr);
  }
  *touch ^= t;
}

/* ---- the tiled path: four rows decoded once, then every row of x ------------------------------
 * Tile layout (in scratch): Wt int16 [nb][4 rows][32], then per block and row D, C (and for
 * q6_k, q3_k and q2_k, whose scales change every 16 elements, D2, C2 for the second half): [nb][4] floats each. */

INLINE void put4(i16 *o, v128_t a, v128_t b, v128_t c, v128_t d) {
  wasm_v128_store(o, a);
  wasm_v128_store(o + 8, b);
  wasm_v128_store(o + 16, c);
  wasm_v128_store(o + 24, d);
}

/* row r (0..3) of a tile from one weight row of nb blocks of 32 */
static void decode_row(i32 qt, const u8 *w, i32 nb, i32 r, i16 *Wt, f32 *Dt, f32 *Ct, f32 *D2t, f32 *C2t) {
  v128_t a, b, c, d;
  switch (qt) {
    case QT_Q4_0: case QT_Q4_1: case QT_Q5_0: case QT_Q5_1: case QT_Q8_0: case QT_IQ4_NL: {
      const i32 bs = q_nbytes(qt);
      for (i32 k = 0; k < nb; k++) {
        const u8 *p = w + k * bs;
        block_lanes(qt, p, &a, &b, &c, &d);
        put4(Wt + (4 * k + r) * 32, a, b, c, d);
        const f32 dd = h2f(ld16(p));
        Dt[4 * k + r] = dd;
        Ct[4 * k + r] = qt == QT_Q4_1 || qt == QT_Q5_1 ? h2f(ld16(p + 2))
                        : qt == QT_Q4_0 ? dd * -8.f : qt == QT_Q5_0 ? dd * -16.f : 0.f;
      }
      return;
    }
    case QT_Q4_K: case QT_Q5_K: {
      const i32 bs = q_nbytes(qt);
      const v128_t m = wasm_i16x8_splat(0x0F), bit = wasm_i16x8_splat(0x10);
      for (i32 sb = 0; sb < nb / 8; sb++) {
        const u8 *p = w + sb * bs, *sc = p + 4, *qh = p + 16, *qs = p + (qt == QT_Q4_K ? 16 : 48);
        const f32 dd = h2f(ld16(p)), dmin = h2f(ld16(p + 2));
        const v128_t h0 = wasm_v128_load(qh), h1 = wasm_v128_load(qh + 16);
        for (i32 j = 0; j < 8; j++) {
          const v128_t v0 = wasm_v128_load(qs + 32 * (j >> 1)), v1 = wasm_v128_load(qs + 32 * (j >> 1) + 16);
          const i32 sh = 4 * (j & 1);
          const v128_t u0 = wasm_u16x8_shr(v0, sh), u1 = wasm_u16x8_shr(v1, sh);
          a = wasm_v128_and(u0, m);
          b = wasm_v128_and(wasm_u16x8_shr(u0, 8), m);
          c = wasm_v128_and(u1, m);
          d = wasm_v128_and(wasm_u16x8_shr(u1, 8), m);
          if (qt == QT_Q5_K) {
            const v128_t t0 = wasm_u16x8_shr(h0, j), t1 = wasm_u16x8_shr(h1, j);
            a = wasm_v128_or(a, wasm_v128_and(wasm_i16x8_shl(t0, 4), bit));
            b = wasm_v128_or(b, wasm_v128_and(wasm_u16x8_shr(t0, 4), bit));
            c = wasm_v128_or(c, wasm_v128_and(wasm_i16x8_shl(t1, 4), bit));
            d = wasm_v128_or(d, wasm_v128_and(wasm_u16x8_shr(t1, 4), bit));
          }
          const i32 k = 8 * sb + j;
          put4(Wt + (4 * k + r) * 32, a, b, c, d);
          i32 s, mn;
          scale_min_k4(j, sc, &s, &mn);
          Dt[4 * k + r] = dd * (f32)s;
          Ct[4 * k + r] = -(dmin * (f32)mn);
        }
      }
      return;
    }
    case QT_Q6_K: {
      const v128_t m = wasm_i16x8_splat(0x0F), two = wasm_i16x8_splat(0x30);
      for (i32 sb = 0; sb < nb / 8; sb++) {
        const u8 *p = w + sb * 210, *ql = p, *qh = p + 128;
        const signed char *sc = (const signed char *)(p + 192);
        const f32 dd = h2f(ld16(p + 208));
        for (i32 cc = 0; cc < 2; cc++) {
          const v128_t H0 = wasm_v128_load(qh + 32 * cc), H1 = wasm_v128_load(qh + 32 * cc + 16);
          for (i32 g = 0; g < 4; g++) {
            const u8 *q = ql + 64 * cc + 32 * (g & 1);
            const i32 ns = 4 * (g >> 1);
            const v128_t u0 = wasm_u16x8_shr(wasm_v128_load(q), ns), u1 = wasm_u16x8_shr(wasm_v128_load(q + 16), ns);
            const v128_t t0 = wasm_u16x8_shr(H0, 2 * g), t1 = wasm_u16x8_shr(H1, 2 * g);
            a = wasm_v128_or(wasm_v128_and(u0, m), wasm_v128_and(wasm_i16x8_shl(t0, 4), two));
            b = wasm_v128_or(wasm_v128_and(wasm_u16x8_shr(u0, 8), m), wasm_v128_and(wasm_u16x8_shr(t0, 4), two));
            c = wasm_v128_or(wasm_v128_and(u1, m), wasm_v128_and(wasm_i16x8_shl(t1, 4), two));
            d = wasm_v128_or(wasm_v128_and(wasm_u16x8_shr(u1, 8), m), wasm_v128_and(wasm_u16x8_shr(t1, 4), two));
            const i32 k = 8 * sb + 4 * cc + g;
            put4(Wt + (4 * k + r) * 32, a, b, c, d);
            const f32 dl = dd * (f32)sc[8 * cc + 2 * g], dh = dd * (f32)sc[8 * cc + 2 * g + 1];
            Dt[4 * k + r] = dl;
            Ct[4 * k + r] = dl * -32.f;
            D2t[4 * k + r] = dh;
            C2t[4 * k + r] = dh * -32.f;
          }
        }
      }
      return;
    }
    case QT_IQ4_XS: {
      /* the table values as lanes (iq4_nl's), D = d * (scale - 32) per 32, no offset */
      for (i32 sb = 0; sb < nb / 8; sb++) {
        const u8 *p = w + sb * 136;
        const f32 dd = h2f(ld16(p));
        for (i32 s = 0; s < 8; s++) {
          iq4_4(p + 8 + 16 * s, &a, &b, &c, &d);
          const i32 k = 8 * sb + s;
          put4(Wt + (4 * k + r) * 32, a, b, c, d);
          Dt[4 * k + r] = dd * (f32)scale_iq4xs(s, p);
          Ct[4 * k + r] = 0.f;
        }
      }
      return;
    }
    case QT_Q2_K: {
      /* 2-bit lanes; D = d * scale, C = -dmin * min, per 16 (the split tile) */
      const v128_t m = wasm_i16x8_splat(3);
      for (i32 sb = 0; sb < nb / 8; sb++) {
        const u8 *p = w + sb * 84, *sc = p, *qs = p + 16;
        const f32 dd = h2f(ld16(p + 80)), dmin = h2f(ld16(p + 82));
        for (i32 i = 0; i < 8; i++) {
          const u8 *q = qs + 32 * (i >> 2);
          const i32 sh = 2 * (i & 3);
          const v128_t u0 = wasm_u16x8_shr(wasm_v128_load(q), sh), u1 = wasm_u16x8_shr(wasm_v128_load(q + 16), sh);
          a = wasm_v128_and(u0, m);
          b = wasm_v128_and(wasm_u16x8_shr(u0, 8), m);
          c = wasm_v128_and(u1, m);
          d = wasm_v128_and(wasm_u16x8_shr(u1, 8), m);
          const i32 k = 8 * sb + i;
          put4(Wt + (4 * k + r) * 32, a, b, c, d);
          const i32 s0 = sc[2 * i], s1 = sc[2 * i + 1];
          Dt[4 * k + r] = dd * (f32)(s0 & 0xF);
          Ct[4 * k + r] = -(dmin * (f32)(s0 >> 4));
          D2t[4 * k + r] = dd * (f32)(s1 & 0xF);
          C2t[4 * k + r] = -(dmin * (f32)(s1 >> 4));
        }
      }
      return;
    }
    case QT_Q3_K: {
      /* the unsigned 3-bit value (low 2 bits | high bit << 2) with C = -4 D: q6_k's scheme */
      const v128_t m = wasm_i16x8_splat(3), bit = wasm_i16x8_splat(4);
      for (i32 sb = 0; sb < nb / 8; sb++) {
        const u8 *p = w + sb * 110, *qs = p + 32, *sc = p + 96;
        const f32 dd = h2f(ld16(p + 108));
        const v128_t H0 = wasm_v128_load(p), H1 = wasm_v128_load(p + 16);
        for (i32 i = 0; i < 8; i++) {
          const u8 *q = qs + 32 * (i >> 2);
          const i32 sh = 2 * (i & 3);
          const v128_t u0 = wasm_u16x8_shr(wasm_v128_load(q), sh), u1 = wasm_u16x8_shr(wasm_v128_load(q + 16), sh);
          const v128_t t0 = wasm_u16x8_shr(H0, i), t1 = wasm_u16x8_shr(H1, i);
          a = wasm_v128_or(wasm_v128_and(u0, m), wasm_v128_and(wasm_i16x8_shl(t0, 2), bit));
          b = wasm_v128_or(wasm_v128_and(wasm_u16x8_shr(u0, 8), m), wasm_v128_and(wasm_u16x8_shr(t0, 6), bit));
          c = wasm_v128_or(wasm_v128_and(u1, m), wasm_v128_and(wasm_i16x8_shl(t1, 2), bit));
          d = wasm_v128_or(wasm_v128_and(wasm_u16x8_shr(u1, 8), m), wasm_v128_and(wasm_u16x8_shr(t1, 6), bit));
          const i32 k = 8 * sb + i;
          put4(Wt + (4 * k + r) * 32, a, b, c, d);
          const f32 dl = dd * (f32)scale_q3k(2 * i, sc), dh = dd * (f32)scale_q3k(2 * i + 1, sc);
          Dt[4 * k + r] = dl;
          Ct[4 * k + r] = dl * -4.f;
          D2t[4 * k + r] = dh;
          C2t[4 * k + r] = dh * -4.f;
        }
      }
      return;
    }
    default: return;
  }
}

/* one row of x (xq, xs) against a decoded tile of 4 rows -> y[0..nr) */
INLINE void tile_row(const i32 split, const i32 hasC, const i16 *Wt, const f32 *Dt, const f32 *Ct, const f32 *D2t,
                     const f32 *C2t, i32 nb, const i16 *xq, const f32 *xs, f32 *y, i32 nr) {
  f32x4 acc = wasm_f32x4_splat(0.f), accm = acc;
  for (i32 k = 0; k < nb; k++) {
    const i16 *xb = xq + 32 * k, *wb = Wt + 128 * k;
    const v128_t X0 = wasm_v128_load(xb), X1 = wasm_v128_load(xb + 8);
    const v128_t X2 = wasm_v128_load(xb + 16), X3 = wasm_v128_load(xb + 24);
    const f32x4 dx = wasm_v128_load32_splat(xs + 4 * k);
#define LO(r) wasm_i32x4_add(wasm_i32x4_dot_i16x8(wasm_v128_load(wb + 32 * r), X0), \
                             wasm_i32x4_dot_i16x8(wasm_v128_load(wb + 32 * r + 8), X1))
#define HI(r) wasm_i32x4_add(wasm_i32x4_dot_i16x8(wasm_v128_load(wb + 32 * r + 16), X2), \
                             wasm_i32x4_dot_i16x8(wasm_v128_load(wb + 32 * r + 24), X3))
    if (split) {
      const f32x4 Pl = wasm_f32x4_convert_i32x4(reduce4(LO(0), LO(1), LO(2), LO(3)));
      const f32x4 Ph = wasm_f32x4_convert_i32x4(reduce4(HI(0), HI(1), HI(2), HI(3)));
      acc = wasm_f32x4_add(acc, wasm_f32x4_mul(wasm_f32x4_mul(Pl, wasm_v128_load(Dt + 4 * k)), dx));
      acc = wasm_f32x4_add(acc, wasm_f32x4_mul(wasm_f32x4_mul(Ph, wasm_v128_load(D2t + 4 * k)), dx));
      accm = wasm_f32x4_add(accm, wasm_f32x4_mul(wasm_v128_load(Ct + 4 * k), wasm_v128_load32_splat(xs + 4 * k + 1)));
      accm = wasm_f32x4_add(accm, wasm_f32x4_mul(wasm_v128_load(C2t + 4 * k), wasm_v128_load32_splat(xs + 4 * k + 2)));
    } else {
      /* the same integer sums and float operations, in the same order, as fused_rows */
      const v128_t p0 = wasm_i32x4_add(LO(0), HI(0)), p1 = wasm_i32x4_add(LO(1), HI(1));
      const v128_t p2 = wasm_i32x4_add(LO(2), HI(2)), p3 = wasm_i32x4_add(LO(3), HI(3));
      const f32x4 P = wasm_f32x4_convert_i32x4(reduce4(p0, p1, p2, p3));
      acc = wasm_f32x4_add(acc, wasm_f32x4_mul(wasm_f32x4_mul(P, wasm_v128_load(Dt + 4 * k)), dx));
      if (hasC) accm = wasm_f32x4_add(accm, wasm_f32x4_mul(wasm_v128_load(Ct + 4 * k), wasm_v128_load32_splat(xs + 4 * k + 3)));
    }
#undef LO
#undef HI
  }
  store_rows(y, hasC ? wasm_f32x4_add(acc, accm) : acc, nr);
}

/* Y (M, N; rows ldy apart) = X . W^T with W decoded four rows at a time into the tile. */
static void tiled(i32 qt, const u8 *w, i32 rb, i32 M, i32 N, i32 nb, const i16 *xq, const f32 *xs, f32 *Y,
                  i32 ldy, f32 *tile) {
  i16 *Wt = (i16 *)tile;
  f32 *Dt = tile + 64 * nb, *Ct = Dt + 4 * nb, *D2t = Ct + 4 * nb, *C2t = D2t + 4 * nb;
  const i32 split = qt == QT_Q6_K || qt == QT_Q3_K || qt == QT_Q2_K, hasC = HAS_C(qt);
  for (i32 n = 0; n < N; n += 4) {
    const i32 nr = N - n < 4 ? N - n : 4;
    for (i32 r = 0; r < 4; r++) decode_row(qt, w + (n + (r < nr ? r : nr - 1)) * rb, nb, r, Wt, Dt, Ct, D2t, C2t);
    for (i32 i = 0; i < M; i++) {
      const i16 *xqi = xq + i * nb * 32;
      const f32 *xsi = xs + i * nb * 4;
      f32 *yi = Y + i * ldy + n;
      if (split) tile_row(1, 1, Wt, Dt, Ct, D2t, C2t, nb, xqi, xsi, yi, nr);
      else if (hasC) tile_row(0, 1, Wt, Dt, Ct, D2t, C2t, nb, xqi, xsi, yi, nr);
      else tile_row(0, 0, Wt, Dt, Ct, D2t, C2t, nb, xqi, xsi, yi, nr);
    }
  }
}

/* ---- float formats (f32, f16, bf16): float rows and the float GEMM ---------------------------- */

static void float_linear(i32 qt, const u8 *w, i32 rb, const f32 *x, f32 *y, i32 ldy, f32 *S, i32 M, i32 N, i32 K) {
  f32 *rows = S, *P = S + FLOAT_ROWS * K;
  for (i32 j = 0; j < N; j += FLOAT_ROWS) {
    const i32 r = N - j < FLOAT_ROWS ? N - j : FLOAT_ROWS;
    const f32 *W;
    if (qt == QT_F32) {
      W = (const f32 *)(w + j * rb);   /* the weight's words are float32 rows already */
    } else {
      for (i32 q = 0; q < r; q++) deq_row(qt, w + (j + q) * rb, rows + q * K, K);
      W = rows;
    }
    if (M <= 16) {
      gemm_dot_one(x, K, W, K, y + j, ldy, M, r, K, 0, 0);
    } else {
      gemm_pack_cols(W, K, P, K, r);
      gemm_packed_one(x, K, P, y + j, ldy, M, r, K, 0, 0);
    }
  }
}

/* ---- the entry point ------------------------------------------------------------------------- */

/* How many of nt threads share a q_linear: work of at least MIN_WORK / 2 multiply-adds each (a
 * product next to other independent ones meets them at one barrier, exec.c, so the split costs
 * less than MIN_WORK assumes). */
i32 q_linear_width(const i32 *prm, const i32 *ctl, i32 nt) {
  return team_width(ctl, nt, (i64)prm[QL_M] * prm[QL_N] * prm[QL_K] * 2);
}

/* The bytes of the weight a q_linear reads (scratch = 0) or of its own scratch it writes when it
 * runs on one thread (scratch = 1), for exec.c's barrier rule; -1 for a table it would refuse or
 * a float format (whose team version uses the team's scratch even on one thread). */
i64 q_linear_extent(const i32 *prm, i32 scratch) {
  const i32 qt = prm[QL_QTYPE], M = prm[QL_M], N = prm[QL_N], K = prm[QL_K];
  i32 blk = 32, nbytes;
  switch (qt) {
    case QT_Q4_0: nbytes = OPQ(18); break;
    case QT_Q4_1: nbytes = OPQ(20); break;
    case QT_Q5_0: nbytes = OPQ(22); break;
    case QT_Q5_1: nbytes = OPQ(24); break;
    case QT_Q8_0: nbytes = OPQ(34); break;
    case QT_Q2_K: nbytes = OPQ(84); blk = 256; break;
    case QT_Q3_K: nbytes = OPQ(110); blk = 256; break;
    case QT_Q4_K: nbytes = OPQ(144); blk = 256; break;
    case QT_Q5_K: nbytes = OPQ(176); blk = 256; break;
    case QT_Q6_K: nbytes = OPQ(210); blk = 256; break;
    case QT_IQ4_NL: nbytes = OPQ(18); break;
    case QT_IQ4_XS: nbytes = OPQ(136); blk = 256; break;
    default: return -1;
  }
  if (M < 0 || N < 0 || K < 0 || K % blk) return -1;
  const i64 nb = K / 32;
  if (scratch) return 4 * ((i64)M * K / 2 + (i64)M * nb * 4 + 80 * nb + 4);
  return (i64)N * (K / blk) * nbytes;
}

/* y (M, N) = x (M, K) . dequantize(w)^T for N rows of K elements of the format prm[QL_QTYPE].
 * scratch (floats; ops_quant.scratch_floats computes the same):
 *   integer formats: xq (M * K / 2) | xs (M * K / 8) | tile (64 nb + 16 nb) | 4 (touch sink)
 *   float formats:   FLOAT_ROWS * K | FLOAT_ROWS * K (packed panels, M > 16)
 * Returns 0, QERR_QTYPE or QERR_SHAPE. */
/* One thread's share (see team.h): the output features split in groups of four rows of w
 * (FLOAT_ROWS for float formats); each thread quantizes x and decodes its tiles (or float rows) in
 * its own scratch. */
i32 q_linear_team(const void *wv, const f32 *x, f32 *y, f32 *scratch, const i32 *prm, i32 *ctl, i32 tid, i32 nt) {
  const u8 *w = (const u8 *)wv;
  const i32 qt = prm[QL_QTYPE], M = prm[QL_M], N = prm[QL_N], K = prm[QL_K];
  const i32 blk = q_block(qt);
  if (!blk) return QERR_QTYPE;
  if (K % blk) return QERR_SHAPE;
  const i32 rb = K / blk * q_nbytes(qt);
  const i32 width = q_linear_width(prm, ctl, nt);
  i32 n0, n1;
  if (blk == 1) {
    team_range(N, FLOAT_ROWS, tid, width, &n0, &n1);
    if (n0 < n1) float_linear(qt, w + n0 * rb, rb, x, y + n0, N, (f32 *)team_scratch(ctl, tid, scratch), M, n1 - n0, K);
    return 0;
  }
  const i32 nb = K / 32;
  team_range(N, 4, tid, width, &n0, &n1);
  if (n0 >= n1) return 0;
  /* every thread quantizes x itself, into its own scratch when there is a team (M * K work
   * against M * N * K: cheaper than a barrier) */
  if (width > 1) scratch = (f32 *)team_scratch(ctl, tid, scratch);
  i16 *xq = (i16 *)scratch;
  f32 *xs = scratch + M * K / 2, *tile = xs + M * nb * 4, *sink = tile + 80 * nb;
  for (i32 i = 0; i < M; i++) quantize_row(x + i * K, K, xq + i * K, xs + i * nb * 4);
  const u8 *wn = w + n0 * rb;
  if (M <= FUSED_MAX_M && (blk == 32 || qt == QT_Q4_K)) {
    i32 touch = 0;
    for (i32 i = 0; i < M; i++) {
      if (blk == 32) fused(qt, wn, n1 - n0, nb, xq + i * K, xs + i * nb * 4, y + i * N + n0, &touch);
      else q4k_fused(wn, n1 - n0, nb, xq + i * K, xs + i * nb * 4, y + i * N + n0, tile, &touch);
    }
    *(i32 *)sink = touch;
  } else {
    tiled(qt, wn, rb, M, n1 - n0, nb, xq, xs, y + n0, N, tile);
  }
  return 0;
}

EXPORT(q_linear) i32 q_linear(const void *wv, const f32 *x, f32 *y, f32 *scratch, const i32 *prm) {
  return q_linear_team(wv, x, y, scratch, prm, 0, 0, 1);
}
