/* Quantized matrix-vector products on x86 vector units: y (m, n) = x (m, k) . dequantize(w)^T for
 * the GGUF formats q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k and q6_k, a few rows of x at a time (decode:
 * m = 1), with AVX-512 (16 weight rows at once) or AVX2 (8 rows). numpy_quant._native_qlinear
 * calls it for those formats and m <= 4; every other case keeps the wasm kernels compiled through
 * SIMDe (wasm_quant.c), whose SIMD128 code SIMDe runs 128 bits at a time.
 *
 * The results are the SAME BITS as wasm/kernels/quant.c's q_linear (the SIMDe path): the same
 * arithmetic, only done with wider registers (a NaN output is NaN in both, its sign either: x86
 * passes on an operand's NaN by position, and the compiler may order a commutative add's operands
 * either way; tests/test_native_qdot.py checks the rest bit for bit).
 *  1. each row of x is rounded per block of 32 to int16 exactly as quant.c's quantize_row does
 *     (dx = amax / 32767, q = round-to-nearest-even of x * (32767 / amax), saturated; a block
 *     holding inf or NaN gets dx = NaN and q = 0), with the block's float sums computed in
 *     quant.c's order ((v0 + v1) + (v2 + v3) over its 4-lane vectors, then (l0 + l2) + (l1 + l3)
 *     for each half of 16, then the two halves added);
 *  2. per block and weight row the integer dot product of the int16 activation with the block's
 *     values (exact in int32: |q| <= 32767, |w| <= 128, 32 terms) by vpmaddwd, one 512-bit (or two
 *     256-bit) products per row-block, then 16 (8) rows' sums transposed into one vector (lane r =
 *     row r) by a tree of unpack / shuffle and adds (q6_k: the two halves of 16 apart);
 *  3. per block, with a lane per weight row, in quant.c's order and without contraction (the
 *     library is built -std=c11: GCC's -ffp-contract=off, and clang contracts only within one
 *     expression, never across these intrinsics):
 *       acc = acc + ((float)isum * D) * dx;   accm = accm + C * sum(x over the block)
 *     and y = acc + accm (q8_0: y = acc), D the block's scale, C its offset (q4_1, q5_1: m; q4_0:
 *     -8 D; q5_0: -16 D; q4_k, q5_k: D = d * sc, C = -(dmin * m) per 32; q6_k per 16: D = d * sc,
 *     C = D * -32, acc taking both halves' products, then accm both offsets, as quant.c's split
 *     tile). The halves convert by F16C (vcvtph2ps), exact for every half as quant.c's h2f.
 *
 * Activation layout (scratch, int16 per block of 32): q8_0 in natural order; the others as
 * [x0 x2 .. x14 | x16 x18 .. x30 | x1 x3 .. x15 | x17 .. x31] (the even elements, then the odd):
 * the order in which one q4_0 block's 16 bytes of nibbles, broadcast to the four 128-bit lanes and
 * shifted right by 0, 4, 8, 12 bits per lane (32-bit shifts; the mask 0x000F keeps each 16-bit
 * word's own nibble), give its 32 values; q5's fifth bits go to that order by two pext and become
 * a mask (a masked add of 16 with AVX-512, a compare per word with AVX2); the k-quants' 32 bytes
 * a sub-block give it with shifts of 0 and 8 (see qd_kq; q5_k's fifth bits by q6_k's rotation).
 *
 * Measured on the 2-core AVX-512 Xeon this was written on, one row of x, one thread, weight in
 * cache (notes/native-qdot.md has the scripts): SIMDe -> here, q4_1 1536 x 576 59 -> 34 us, q5_0
 * 80 -> 40, q8_0 576 x 576 23 -> 15, q4_k 576 x 1536 89 -> 40, q6_k 98 -> 53; with the weight out of
 * L2 (a decode) q4_1 1536 x 576 114 -> 75 us (reading it alone takes ~50). The software prefetch
 * (QD_AHEAD groups on) took that from 87 to 75; distances 1-8, hints T1 / T2 / NTA and all of a
 * group's prefetches at its first block were no better. The AVX2 code (8 rows, an x86-64-v3
 * build) runs about as fast as the AVX-512 code on that machine.
 *
 * Without AVX2 + F16C + BMI2 (an EMBER_NATIVE_MARCH=x86-64 build, another architecture) the entry
 * point returns QD_ENOISA (ember_qdot_isa() 0) and Python keeps the SIMDe path. */
#include "ember_native.h"

#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

/* ggml type numbers */
enum { QD_Q4_0 = 2, QD_Q4_1 = 3, QD_Q5_0 = 6, QD_Q5_1 = 7, QD_Q8_0 = 8, QD_Q4_K = 12, QD_Q5_K = 13, QD_Q6_K = 14 };
/* q8_0 weights with int8 activations (llama.cpp's numerics, not quant.c's bits): AVX-512 VNNI builds only */
#define QD_Q8_0_I8 108
#define QD_EQTYPE (-1) /* a format this file does not cover */
#define QD_ESHAPE (-2) /* k not a whole number of blocks, or a negative size */
#define QD_ENOISA (-3) /* this build has no AVX2 + F16C + BMI2 code */

#if (defined(__x86_64__) || defined(__i386__)) && defined(__AVX2__) && defined(__F16C__) && defined(__BMI2__)
#include <immintrin.h>
#define QD_HAVE 1
#ifndef QD_AHEAD
#define QD_AHEAD 2   /* prefetch distance in groups of rows */
#endif
#ifndef QD_HINT
#define QD_HINT _MM_HINT_T0
#endif
/* q8_0's rows are prefetched to L2 (T1), the others' to L1 (QD_HINT): on the 2-core AVX-512 Xeon,
 * 30 layers of SmolLM2-135M's products, cold, one thread (notes/native-qdot-int8-scripts/cold.py,
 * variants built with -DQD_AHEAD / -DQD_HINT), q8_0 13.2 -> 11.6 ms (T1; T2 the same, NTA 21.4,
 * distances 1-8 the same within noise), q4_1 6.7 -> 7.2 ms and q4_k 9.5 either way */
#define QD_PREFETCH(QT, p)                                         \
  do {                                                            \
    if ((QT) == QD_Q8_0) _mm_prefetch((const char *)(p), _MM_HINT_T1); \
    else _mm_prefetch((const char *)(p), QD_HINT);                \
  } while (0)
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define QD_ROWS 16
#else
#define QD_ROWS 8
#endif
#else
#define QD_HAVE 0
#define QD_ROWS 0
#endif

/* which code this build runs: 512 (AVX-512, 16 rows), 256 (AVX2, 8 rows) or 0 (none) */
EXPORT i64 ember_qdot_isa(void) { return QD_ROWS == 16 ? 512 : QD_ROWS == 8 ? 256 : 0; }

/* whether ember_qdot_linear takes QD_Q8_0_I8 (q8_0 weights, int8 activations, AVX-512 VNNI): 1 or 0 */
EXPORT i64 ember_qdot_i8(void);

/* scratch bytes ember_qdot_linear needs for m rows of k: the int16 activation and 4 floats a block */
EXPORT i64 ember_qdot_scratch_bytes(i64 m, i64 k) { return m * k * 2 + m * (k / 32) * 16; }

#if QD_HAVE

/* ---- the activation: quant.c's quantize_row, bit for bit ------------------------------------ */

/* (l0 + l2) + (l1 + l3): quant.c's hsum4 (lane 0 of its two shuffled adds) */
INLINE f32 qd_hsum4(__m128 v) {
  v = _mm_add_ps(v, _mm_shuffle_ps(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = _mm_add_ps(v, _mm_shuffle_ps(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtss_f32(v);
}

/* 8 floats * id rounded to nearest even, NaN -> 0, clamped to [-32768, 32767] (quant.c: nearest,
 * saturating truncation to int32, saturating narrowing to int16), as int32 */
INLINE __m256i qd_round8(__m256 v, __m256 id) {
  __m256 r = _mm256_round_ps(_mm256_mul_ps(v, id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  r = _mm256_and_ps(r, _mm256_cmp_ps(r, r, _CMP_ORD_Q));
  r = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-32768.f)), _mm256_set1_ps(32767.f));
  return _mm256_cvttps_epi32(r);
}

/* one row of k floats -> xq (k int16 in the layout above: nib = q4 formats) and xs (dx, the
 * block's sum) per block */
static void qd_quantize_row(const f32 *x, i64 k, int nib, int16_t *xq, f32 *xs) {
  const __m256i absm = _mm256_set1_epi32(0x7FFFFFFF);
  for (i64 b = 0; b < k / 32; b++) {
    const f32 *p = x + 32 * b;
    const __m256 a0 = _mm256_loadu_ps(p), a1 = _mm256_loadu_ps(p + 8);
    const __m256 a2 = _mm256_loadu_ps(p + 16), a3 = _mm256_loadu_ps(p + 24);
    /* the largest |x| as bits (the order of non-negative floats; NaN above inf) */
    __m256i mx = _mm256_max_epu32(_mm256_max_epu32(_mm256_and_si256(_mm256_castps_si256(a0), absm),
                                                   _mm256_and_si256(_mm256_castps_si256(a1), absm)),
                                  _mm256_max_epu32(_mm256_and_si256(_mm256_castps_si256(a2), absm),
                                                   _mm256_and_si256(_mm256_castps_si256(a3), absm)));
    __m128i m4 = _mm_max_epu32(_mm256_castsi256_si128(mx), _mm256_extracti128_si256(mx, 1));
    m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, _MM_SHUFFLE(1, 0, 3, 2)));
    m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, _MM_SHUFFLE(2, 3, 0, 1)));
    const uint32_t abits = (uint32_t)_mm_cvtsi128_si32(m4);
    /* sums: quant.c's v0..v7 are the 4-float quarters of a0..a3 */
    const __m128 s0v = _mm_add_ps(_mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1)),
                                  _mm_add_ps(_mm256_castps256_ps128(a1), _mm256_extractf128_ps(a1, 1)));
    const __m128 s1v = _mm_add_ps(_mm_add_ps(_mm256_castps256_ps128(a2), _mm256_extractf128_ps(a2, 1)),
                                  _mm_add_ps(_mm256_castps256_ps128(a3), _mm256_extractf128_ps(a3, 1)));
    const f32 s0 = qd_hsum4(s0v), s1 = qd_hsum4(s1v);
    int16_t *o = xq + 32 * b;
    f32 d = 0.f;
    if (abits > 0x7F7FFFFFu) {   /* inf or NaN in the block: dx = NaN, q = 0 */
      d = __builtin_nanf("");
      _mm256_storeu_si256((__m256i *)o, _mm256_setzero_si256());
      _mm256_storeu_si256((__m256i *)(o + 16), _mm256_setzero_si256());
    } else {
      f32 id = 0.f;
      if (abits) {
        union { uint32_t u; f32 f; } c = {abits};
        d = c.f / 32767.f;
        id = 32767.f / c.f;
      }
      const __m256 vid = _mm256_set1_ps(id);
      /* int16 of elements 0..15 and 16..31 in natural order (packs works per 128-bit lane) */
      __m256i lo = _mm256_packs_epi32(qd_round8(a0, vid), qd_round8(a1, vid));
      __m256i hi = _mm256_packs_epi32(qd_round8(a2, vid), qd_round8(a3, vid));
      lo = _mm256_permute4x64_epi64(lo, _MM_SHUFFLE(3, 1, 2, 0));
      hi = _mm256_permute4x64_epi64(hi, _MM_SHUFFLE(3, 1, 2, 0));
      if (nib) {   /* evens then odds of each 16: [e(0..15) | e(16..31) | o(0..15) | o(16..31)] */
        const __m256i sh = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                            0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
        lo = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(lo, sh), _MM_SHUFFLE(3, 1, 2, 0));   /* e(lo) | o(lo) */
        hi = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(hi, sh), _MM_SHUFFLE(3, 1, 2, 0));   /* e(hi) | o(hi) */
        const __m256i ev = _mm256_permute2x128_si256(lo, hi, 0x20), od = _mm256_permute2x128_si256(lo, hi, 0x31);
        lo = ev;
        hi = od;
      }
      _mm256_storeu_si256((__m256i *)o, lo);
      _mm256_storeu_si256((__m256i *)(o + 16), hi);
    }
    xs[4 * b] = d;
    xs[4 * b + 1] = s0;
    xs[4 * b + 2] = s1;
    xs[4 * b + 3] = s0 + s1;
  }
}

/* ---- the weight rows ---------------------------------------------------------------------------- */

INLINE i64 qd_bytes(const int QT) {
  return QT == QD_Q8_0 ? 34 : QT == QD_Q4_1 ? 20 : QT == QD_Q5_0 ? 22 : QT == QD_Q5_1 ? 24 : 18;
}
/* where a block's nibbles start, and (q5) its 32 fifth bits */
INLINE i64 qd_qs(const int QT) { return QT == QD_Q4_0 ? 2 : QT == QD_Q4_1 ? 4 : QT == QD_Q5_0 ? 6 : 8; }
INLINE i64 qd_qh(const int QT) { return QT == QD_Q5_0 ? 2 : 4; }
INLINE int qd_q5(const int QT) { return QT == QD_Q5_0 || QT == QD_Q5_1; }
/* whether the block's offset C is its second half (q4_1, q5_1: m) rather than a multiple of D */
INLINE int qd_hasm(const int QT) { return QT == QD_Q4_1 || QT == QD_Q5_1; }
/* q5: bit e of qh is element e's fifth bit; the lanes of the layout above hold the even elements
 * (0, 2, .., 30) in words 0..15 and the odd ones in words 16..31: one bit per word, in order */
INLINE uint32_t qd_q5bits(const uint8_t *p) {
  uint32_t qh;
  __builtin_memcpy(&qh, p, 4);
  return _pext_u32(qh, 0x55555555u) | (_pext_u32(qh, 0xAAAAAAAAu) << 16);
}

/* the k-quants (256 per super-block, 8 activation blocks of 32): q4_k's sub-block j is 32 bytes
 * of nibbles (low for even j, high for odd; byte l: element l), which broadcast to both 256-bit
 * halves and shifted by 4 (j & 1) and 8 + 4 (j & 1) give the even elements, then the odd ones:
 * the layout above. q6_k's 32-block j = 4 cc + g takes its low 4 bits likewise from ql (64 cc +
 * 32 (g & 1), shift 4 (g >> 1)) and bits 2g, 2g + 1 of qh (32 cc) as bits 4, 5; its two halves of 16
 * have their own scales (sc[2 j], sc[2 j + 1]), so their sums stay apart (quant.c's split tile). */
INLINE int qd_kq(const int QT) { return QT == QD_Q4_K || QT == QD_Q5_K || QT == QD_Q6_K; }
INLINE i64 qd_sbytes(const int QT) { return QT == QD_Q4_K ? 144 : QT == QD_Q5_K ? 176 : 210; }

#if QD_ROWS == 16

/* block j (k-quants: of the super-block at p) of one row as 32 int16 in the activation's layout,
 * times the activation: 16 int32 */
INLINE __m512i qd_dot(const int QT, const uint8_t *p, int j, __m512i X) {
  const __m512i m4 = _mm512_set1_epi32(0x000F000F);
  const __m512i halves = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8, 8, 8, 8, 8);
  __m512i w;
  if (QT == QD_Q8_0) {
    w = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(p + 2)));
  } else if (QT == QD_Q4_K || QT == QD_Q5_K) {
    const i64 qs = QT == QD_Q4_K ? 16 : 48;
    const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(p + qs + 32 * (j >> 1))));
    w = _mm512_and_si512(_mm512_srlv_epi32(v, _mm512_add_epi32(halves, _mm512_set1_epi32(4 * (j & 1)))), m4);
    if (QT == QD_Q5_K) {   /* bit j of qh's byte l to bit 4 of element l's word (q6_k's rotation) */
      const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(p + 16)));
      const __m512i rot = _mm512_and_si512(_mm512_add_epi32(halves, _mm512_set1_epi32(j - 4)), _mm512_set1_epi32(31));
      w = _mm512_or_si512(w, _mm512_and_si512(_mm512_rorv_epi32(h, rot), _mm512_set1_epi32(0x00100010)));
    }
  } else if (QT == QD_Q6_K) {
    const int cc = j >> 2, g = j & 3;
    const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(p + 64 * cc + 32 * (g & 1))));
    const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(p + 128 + 32 * cc)));
    const __m512i ns = _mm512_add_epi32(halves, _mm512_set1_epi32(4 * (g >> 1)));
    const __m512i lo = _mm512_and_si512(_mm512_srlv_epi32(q, ns), m4);
    /* bits 2g, 2g + 1 of each byte to bits 4, 5 of its word: a rotation right by 2g - 4 (even
     * elements: the low byte) or 8 + 2g - 4 (odd: the high byte), then the mask */
    const __m512i rot = _mm512_and_si512(_mm512_add_epi32(halves, _mm512_set1_epi32(2 * g - 4)),
                                         _mm512_set1_epi32(31));
    w = _mm512_or_si512(lo, _mm512_and_si512(_mm512_rorv_epi32(h, rot), _mm512_set1_epi32(0x00300030)));
  } else {
    const __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(p + qd_qs(QT))));
    const __m512i sh = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
    w = _mm512_and_si512(_mm512_srlv_epi32(v, sh), m4);
    if (qd_q5(QT)) w = _mm512_mask_add_epi16(w, (__mmask32)qd_q5bits(p + qd_qh(QT)), w, _mm512_set1_epi16(16));
  }
  return _mm512_madd_epi16(w, X);
}

/* lanes of a, b: [a0+a2, b0+b2, a1+a3, b1+b3] per 128-bit lane */
INLINE __m512i qd_pair32(__m512i a, __m512i b) {
  return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}
INLINE __m512i qd_pair64(__m512i a, __m512i b) {
  return _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
}
INLINE __m512i qd_pair128(__m512i a, __m512i b) {
  return _mm512_add_epi32(_mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}
/* [a0 + a2, a1 + a3, b0 + b2, b1 + b3] of 128-bit lanes: q6_k's halves (lanes 0, 2: elements
 * 0..15 of the block; 1, 3: 16..31) kept apart */
INLINE __m512i qd_pair_split(__m512i a, __m512i b) {
  return _mm512_add_epi32(_mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                          _mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}

INLINE __m512 qd_half_lo(__m512i g) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g)); }
INLINE __m512 qd_half_hi(__m512i g) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16))); }
INLINE __m512 qd_neg(__m512 v) {
  return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), _mm512_set1_epi32((i32)0x80000000)));
}

/* y[0..nr) = rows w + off[r] (nr <= 16; the offsets of lanes >= nr repeat the last row) . x */
INLINE void qd_group(const int QT, const uint8_t *w, const i32 *off, i64 nr, i64 nb, const int16_t *xq,
                     const f32 *xs, f32 *y, const uint8_t *pf, i64 pfstep, i64 pflen) {
  const i64 bs = qd_bytes(QT);
  const __m512i vo = _mm512_loadu_si512((const void *)off);
  const uint8_t *r[16];
  for (int i = 0; i < 16; i++) r[i] = w + off[i];
  __m512 acc = _mm512_setzero_ps(), accm = acc;
  __m512 sD[16], sC[8];   /* k-quants: the super-block's scales, a lane per row */
  for (i64 b = 0; b < nb; b++) {
    const int j = qd_kq(QT) ? (int)(b & 7) : 0;
    const i64 o = qd_kq(QT) ? (b >> 3) * qd_sbytes(QT) : b * bs;
    for (i64 a = b * pfstep; a < (b + 1) * pfstep && a < pflen; a += 64)
      QD_PREFETCH(QT, pf + a);
    if ((QT == QD_Q4_K || QT == QD_Q5_K) && j == 0) {   /* quant.c's q4k_scales: D = d * sc, C = -(dmin * m) */
      const __m512i g = _mm512_i32gather_epi32(vo, (const void *)(w + o), 1);
      const __m512i G0 = _mm512_i32gather_epi32(vo, (const void *)(w + o + 4), 1);
      const __m512i G1 = _mm512_i32gather_epi32(vo, (const void *)(w + o + 8), 1);
      const __m512i G2 = _mm512_i32gather_epi32(vo, (const void *)(w + o + 12), 1);
      const __m512 dd = qd_half_lo(g), dmin = qd_half_hi(g);
      const __m512i m6 = _mm512_set1_epi32(63), m4 = _mm512_set1_epi32(15), m2 = _mm512_set1_epi32(3);
      for (int s = 0; s < 8; s++) {
        __m512i sc, mn;
        if (s < 4) {
          sc = _mm512_and_si512(_mm512_srli_epi32(G0, 8 * s), m6);
          mn = _mm512_and_si512(_mm512_srli_epi32(G1, 8 * s), m6);
        } else {
          const int t = 8 * (s - 4);
          sc = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(G2, t), m4),
                               _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(G0, t + 6), m2), 4));
          mn = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(G2, t + 4), m4),
                               _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(G1, t + 6), m2), 4));
        }
        sD[s] = _mm512_mul_ps(dd, _mm512_cvtepi32_ps(sc));
        sC[s] = qd_neg(_mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn)));
      }
    }
    if (QT == QD_Q6_K && j == 0) {   /* D = d * sc per 16 (int8 scales), C = D * -32 */
      const __m512 dd = qd_half_hi(_mm512_i32gather_epi32(vo, (const void *)(w + o + 206), 1));
      for (int q = 0; q < 4; q++) {
        const __m512i S = _mm512_i32gather_epi32(vo, (const void *)(w + o + 192 + 4 * q), 1);
        for (int t = 0; t < 4; t++)
          sD[4 * q + t] = _mm512_mul_ps(dd, _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(S, 24 - 8 * t),
                                                                                   24)));
      }
    }
    const __m512i X = _mm512_loadu_si512((const void *)(xq + 32 * b));
#define QD_T(i) qd_dot(QT, r[i] + o, j, X)
    const __m512i t0 = qd_pair32(QD_T(0), QD_T(1)), t1 = qd_pair32(QD_T(2), QD_T(3));
    const __m512i t2 = qd_pair32(QD_T(4), QD_T(5)), t3 = qd_pair32(QD_T(6), QD_T(7));
    const __m512i t4 = qd_pair32(QD_T(8), QD_T(9)), t5 = qd_pair32(QD_T(10), QD_T(11));
    const __m512i t6 = qd_pair32(QD_T(12), QD_T(13)), t7 = qd_pair32(QD_T(14), QD_T(15));
#undef QD_T
    const __m512i u0 = qd_pair64(t0, t1), u1 = qd_pair64(t2, t3), u2 = qd_pair64(t4, t5), u3 = qd_pair64(t6, t7);
    const __m512 dx = _mm512_set1_ps(xs[4 * b]);
    if (QT == QD_Q6_K) {   /* quant.c's split tile: both halves into acc, then both offsets into accm */
      const __m512i v01 = qd_pair_split(u0, u1), v23 = qd_pair_split(u2, u3);
      const __m512 Pl = _mm512_cvtepi32_ps(_mm512_shuffle_i32x4(v01, v23, _MM_SHUFFLE(2, 0, 2, 0)));
      const __m512 Ph = _mm512_cvtepi32_ps(_mm512_shuffle_i32x4(v01, v23, _MM_SHUFFLE(3, 1, 3, 1)));
      const __m512 Dl = sD[2 * j], Dh = sD[2 * j + 1], k32 = _mm512_set1_ps(-32.f);
      acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(Pl, Dl), dx));
      acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(Ph, Dh), dx));
      accm = _mm512_add_ps(accm, _mm512_mul_ps(_mm512_mul_ps(Dl, k32), _mm512_set1_ps(xs[4 * b + 1])));
      accm = _mm512_add_ps(accm, _mm512_mul_ps(_mm512_mul_ps(Dh, k32), _mm512_set1_ps(xs[4 * b + 2])));
      continue;
    }
    const __m512 P = _mm512_cvtepi32_ps(qd_pair128(qd_pair128(u0, u1), qd_pair128(u2, u3)));   /* lane r: row r */
    __m512 D, C;
    if (QT == QD_Q4_K || QT == QD_Q5_K) {
      D = sD[j];
      C = sC[j];
    } else {   /* the block's first 4 bytes of each row: d (and m) as halves */
      const __m512i g = _mm512_i32gather_epi32(vo, (const void *)(w + o), 1);
      D = qd_half_lo(g);
      C = qd_hasm(QT) ? qd_half_hi(g) : _mm512_mul_ps(D, _mm512_set1_ps(QT == QD_Q5_0 ? -16.f : -8.f));
    }
    acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(P, D), dx));
    if (QT != QD_Q8_0) accm = _mm512_add_ps(accm, _mm512_mul_ps(C, _mm512_set1_ps(xs[4 * b + 3])));
  }
  const __m512 out = QT == QD_Q8_0 ? acc : _mm512_add_ps(acc, accm);
  _mm512_mask_storeu_ps(y, (__mmask16)((1u << nr) - 1), out);
}


#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define QD_I8 1
/* ---- q8_0 with int8 activations (qtype QD_Q8_0_I8, numpy_quant.QDOT_INT8): llama.cpp's numerics
 * (not quant.c's bits): x rounded per block of 32 to int8 (dx = amax / 127, q = nearest-even of
 * x * (127 / amax); an inf / NaN block: dx = NaN, q = 0), then per block and row the exact int32 dot of
 * the two int8 blocks by vpdpbusd (unsigned x signed: the weight bytes xor 0x80 are w + 128, so the
 * sum is dot + 128 sum(q), and 128 sum(q) is subtracted per block), 16 rows' sums transposed to a lane
 * per row with two rows a 512-bit register (half the shuffles of the int16 path), then as the int16
 * path: acc = acc + ((float)isum * D) * dx. Half the activation bytes and one vpdpbusd per two
 * row-blocks instead of a widening load and a vpmaddwd per row-block. */

/* one row of k floats -> xq (k int8) and per block dx (xd) and 128 * sum(q) (xc) */
static void qd_quantize_row_i8(const f32 *x, i64 k, int8_t *xq, f32 *xd, i32 *xc) {
  const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF);
  for (i64 b = 0; b < k / 32; b++) {
    const __m512 a0 = _mm512_loadu_ps(x + 32 * b), a1 = _mm512_loadu_ps(x + 32 * b + 16);
    const uint32_t abits = (uint32_t)_mm512_reduce_max_epu32(
        _mm512_max_epu32(_mm512_and_si512(_mm512_castps_si512(a0), absm), _mm512_and_si512(_mm512_castps_si512(a1), absm)));
    int8_t *o = xq + 32 * b;
    if (abits > 0x7F7FFFFFu || !abits) {   /* inf or NaN: dx = NaN; all zero: dx = 0; q = 0 */
      _mm256_storeu_si256((__m256i *)o, _mm256_setzero_si256());
      xd[b] = abits ? __builtin_nanf("") : 0.f;
      xc[b] = 0;
      continue;
    }
    union { uint32_t u; f32 f; } c = {abits};
    const __m512 id = _mm512_set1_ps(127.f / c.f);
    const __m512i q0 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(a0, id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i q1 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(a1, id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m128i b0 = _mm512_cvtsepi32_epi8(q0), b1 = _mm512_cvtsepi32_epi8(q1);
    _mm_storeu_si128((__m128i *)o, b0);
    _mm_storeu_si128((__m128i *)(o + 16), b1);
    xd[b] = c.f / 127.f;
    xc[b] = 128 * _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_cvtepi8_epi32(b0), _mm512_cvtepi8_epi32(b1)));
  }
}

/* two rows' blocks (lo: row a, hi: row b) . X (the block's int8 activation in both halves) */
INLINE __m512i qd_dot2_i8(const uint8_t *pa, const uint8_t *pb, __m512i X) {
  const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(pa + 2))),
                                       _mm256_loadu_si256((const __m256i *)(pb + 2)), 1);
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(w, _mm512_set1_epi8((char)0x80)), X);
}

INLINE void qd_group_i8(const uint8_t *w, const i32 *off, i64 nr, i64 nb, const int8_t *xq, const f32 *xd,
                        const i32 *xc, f32 *y, const uint8_t *pf, i64 pfstep, i64 pflen) {
  const __m512i vo = _mm512_loadu_si512((const void *)off);
  const uint8_t *r[16];
  for (int i = 0; i < 16; i++) r[i] = w + off[i];
  __m512 acc = _mm512_setzero_ps();
  for (i64 b = 0; b < nb; b++) {
    const i64 o = b * 34;
    for (i64 a = b * pfstep; a < (b + 1) * pfstep && a < pflen; a += 64)
      QD_PREFETCH(QD_Q8_0, pf + a);
    const __m512i X = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xq + 32 * b)));
    /* register i: rows i (low half) and i + 4 (high) for i < 4, 8 + .. for the second four: after the
     * tree, lane r is row r */
#define QD_T(i) qd_dot2_i8(r[(i) + 4 * ((i) >> 2)] + o, r[(i) + 4 * ((i) >> 2) + 4] + o, X)
    const __m512i t0 = qd_pair32(QD_T(0), QD_T(1)), t1 = qd_pair32(QD_T(2), QD_T(3));
    const __m512i t2 = qd_pair32(QD_T(4), QD_T(5)), t3 = qd_pair32(QD_T(6), QD_T(7));
#undef QD_T
    const __m512i u0 = qd_pair64(t0, t1), u1 = qd_pair64(t2, t3);
    const __m512i s = _mm512_add_epi32(_mm512_shuffle_i32x4(u0, u1, _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm512_shuffle_i32x4(u0, u1, _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 P = _mm512_cvtepi32_ps(_mm512_sub_epi32(s, _mm512_set1_epi32(xc[b])));
    const __m512 D = qd_half_lo(_mm512_i32gather_epi32(vo, (const void *)(w + o), 1));
    acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(P, D), _mm512_set1_ps(xd[b])));
  }
  _mm512_mask_storeu_ps(y, (__mmask16)((1u << nr) - 1), acc);
}

static void qd_rows_i8(const uint8_t *w, i64 m, i64 n, i64 nb, const int8_t *xq, const f32 *xd, const i32 *xc,
                       f32 *y, i64 ldy) {
  const i64 rb = nb * 34;
  i32 off[16];
  for (i64 j = 0; j < n; j += 16) {
    const i64 nr = n - j < 16 ? n - j : 16;
    for (i64 r = 0; r < 16; r++) off[r] = (i32)((r < nr ? r : nr - 1) * rb);
    const i64 p0 = (j + QD_AHEAD * 16) * rb, p1 = p0 + 16 * rb < n * rb ? p0 + 16 * rb : n * rb;
    const i64 len = p1 > p0 ? p1 - p0 : 0, step = (16 * rb + nb - 1) / nb;
    for (i64 i = 0; i < m; i++)
      qd_group_i8(w + j * rb, off, nr, nb, xq + i * nb * 32, xd + i * nb, xc + i * nb, y + i * ldy + j,
                  len ? w + p0 : w, step, i ? 0 : len);
  }
}
#endif

#else /* QD_ROWS == 8: AVX2 */

INLINE __m256i qd_dot(const int QT, const uint8_t *p, int j, const int16_t *xb) {
  const __m256i X0 = _mm256_loadu_si256((const __m256i *)xb), X1 = _mm256_loadu_si256((const __m256i *)(xb + 16));
  const __m256i m4 = _mm256_set1_epi32(0x000F000F);
  __m256i a, b;
  if (QT == QD_Q8_0) {
    a = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 2)));
    b = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 18)));
  } else if (QT == QD_Q4_K || QT == QD_Q5_K) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)(p + (QT == QD_Q4_K ? 16 : 48) + 32 * (j >> 1)));
    const int sh = 4 * (j & 1);
    a = _mm256_and_si256(_mm256_srl_epi32(v, _mm_cvtsi32_si128(sh)), m4);
    b = _mm256_and_si256(_mm256_srl_epi32(v, _mm_cvtsi32_si128(sh + 8)), m4);
    if (QT == QD_Q5_K) {
      const __m256i h = _mm256_loadu_si256((const __m256i *)(p + 16)), m1 = _mm256_set1_epi32(0x00010001);
      const __m256i ha = _mm256_and_si256(_mm256_srl_epi32(h, _mm_cvtsi32_si128(j)), m1);
      const __m256i hb = _mm256_and_si256(_mm256_srl_epi32(h, _mm_cvtsi32_si128(j + 8)), m1);
      a = _mm256_or_si256(a, _mm256_slli_epi32(ha, 4));
      b = _mm256_or_si256(b, _mm256_slli_epi32(hb, 4));
    }
  } else if (QT == QD_Q6_K) {
    const int cc = j >> 2, g = j & 3, ns = 4 * (g >> 1);
    const __m256i q = _mm256_loadu_si256((const __m256i *)(p + 64 * cc + 32 * (g & 1)));
    const __m256i h = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * cc));
    const __m256i m2 = _mm256_set1_epi32(0x00030003);
    const __m256i ha = _mm256_and_si256(_mm256_srl_epi32(h, _mm_cvtsi32_si128(2 * g)), m2);
    const __m256i hb = _mm256_and_si256(_mm256_srl_epi32(h, _mm_cvtsi32_si128(2 * g + 8)), m2);
    a = _mm256_or_si256(_mm256_and_si256(_mm256_srl_epi32(q, _mm_cvtsi32_si128(ns)), m4), _mm256_slli_epi32(ha, 4));
    b = _mm256_or_si256(_mm256_and_si256(_mm256_srl_epi32(q, _mm_cvtsi32_si128(ns + 8)), m4), _mm256_slli_epi32(hb, 4));
  } else {
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p + qd_qs(QT))));
    a = _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), m4);
    b = _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_setr_epi32(8, 8, 8, 8, 12, 12, 12, 12)), m4);
    if (qd_q5(QT)) {   /* word j of a gets 16 where bit j of the lanes' bits is set, of b bit 16 + j */
      const uint32_t hb = qd_q5bits(p + qd_qh(QT));
      const __m256i bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
                                            (short)0x8000);
      const __m256i s16 = _mm256_set1_epi16(16);
      const __m256i ha = _mm256_and_si256(_mm256_set1_epi16((short)(hb & 0xFFFF)), bit);
      const __m256i hc = _mm256_and_si256(_mm256_set1_epi16((short)(hb >> 16)), bit);
      a = _mm256_or_si256(a, _mm256_and_si256(_mm256_cmpeq_epi16(ha, bit), s16));
      b = _mm256_or_si256(b, _mm256_and_si256(_mm256_cmpeq_epi16(hc, bit), s16));
    }
  }
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
  return _mm256_dpwssd_avx_epi32(_mm256_madd_epi16(a, X0), b, X1);
#else
  return _mm256_add_epi32(_mm256_madd_epi16(a, X0), _mm256_madd_epi16(b, X1));
#endif
}

INLINE __m256i qd_pair32(__m256i a, __m256i b) {
  return _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
}
INLINE __m256i qd_pair64(__m256i a, __m256i b) {
  return _mm256_add_epi32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
}

/* the 8 lanes' low 16 bits (and high) as 8 halves in 128 bits each */
INLINE __m256i qd_halves(__m256i g) {
  const __m256i ph = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                      0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
  return _mm256_permute4x64_epi64(_mm256_shuffle_epi8(g, ph), _MM_SHUFFLE(3, 1, 2, 0));
}
INLINE __m256 qd_neg(__m256 v) { return _mm256_xor_ps(v, _mm256_set1_ps(-0.f)); }

INLINE void qd_group(const int QT, const uint8_t *w, const i32 *off, i64 nr, i64 nb, const int16_t *xq,
                     const f32 *xs, f32 *y, const uint8_t *pf, i64 pfstep, i64 pflen) {
  const i64 bs = qd_bytes(QT);
  const __m256i vo = _mm256_loadu_si256((const __m256i *)off);
  const uint8_t *r[8];
  for (int i = 0; i < 8; i++) r[i] = w + off[i];
  __m256 acc = _mm256_setzero_ps(), accm = acc;
  __m256 sD[16], sC[8];
  for (i64 b = 0; b < nb; b++) {
    const int j = qd_kq(QT) ? (int)(b & 7) : 0;
    const i64 o = qd_kq(QT) ? (b >> 3) * qd_sbytes(QT) : b * bs;
    for (i64 a = b * pfstep; a < (b + 1) * pfstep && a < pflen; a += 64)
      QD_PREFETCH(QT, pf + a);
    if ((QT == QD_Q4_K || QT == QD_Q5_K) && j == 0) {
      const __m256i h = qd_halves(_mm256_i32gather_epi32((const int *)(w + o), vo, 1));
      const __m256 dd = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
      const __m256 dmin = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
      const __m256i G0 = _mm256_i32gather_epi32((const int *)(w + o + 4), vo, 1);
      const __m256i G1 = _mm256_i32gather_epi32((const int *)(w + o + 8), vo, 1);
      const __m256i G2 = _mm256_i32gather_epi32((const int *)(w + o + 12), vo, 1);
      const __m256i m6 = _mm256_set1_epi32(63), m4 = _mm256_set1_epi32(15), m2 = _mm256_set1_epi32(3);
      for (int s = 0; s < 8; s++) {
        __m256i sc, mn;
        if (s < 4) {
          sc = _mm256_and_si256(_mm256_srli_epi32(G0, 8 * s), m6);
          mn = _mm256_and_si256(_mm256_srli_epi32(G1, 8 * s), m6);
        } else {
          const int t = 8 * (s - 4);
          sc = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(G2, t), m4),
                               _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(G0, t + 6), m2), 4));
          mn = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(G2, t + 4), m4),
                               _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(G1, t + 6), m2), 4));
        }
        sD[s] = _mm256_mul_ps(dd, _mm256_cvtepi32_ps(sc));
        sC[s] = qd_neg(_mm256_mul_ps(dmin, _mm256_cvtepi32_ps(mn)));
      }
    }
    if (QT == QD_Q6_K && j == 0) {
      const __m256i h = qd_halves(_mm256_i32gather_epi32((const int *)(w + o + 206), vo, 1));
      const __m256 dd = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
      for (int q = 0; q < 4; q++) {
        const __m256i S = _mm256_i32gather_epi32((const int *)(w + o + 192 + 4 * q), vo, 1);
        for (int t = 0; t < 4; t++)
          sD[4 * q + t] = _mm256_mul_ps(dd, _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(S, 24 - 8 * t),
                                                                                   24)));
      }
    }
    const int16_t *xb = xq + 32 * b;
#define QD_T(i) qd_dot(QT, r[i] + o, j, xb)
    const __m256i t0 = qd_pair32(QD_T(0), QD_T(1)), t1 = qd_pair32(QD_T(2), QD_T(3));
    const __m256i t2 = qd_pair32(QD_T(4), QD_T(5)), t3 = qd_pair32(QD_T(6), QD_T(7));
#undef QD_T
    const __m256i u0 = qd_pair64(t0, t1), u1 = qd_pair64(t2, t3);
    /* 128-bit lane 0 of each: elements 0..15 of the block (q6_k's first half), lane 1: 16..31 */
    const __m256i lo = _mm256_permute2x128_si256(u0, u1, 0x20), hi = _mm256_permute2x128_si256(u0, u1, 0x31);
    const __m256 dx = _mm256_set1_ps(xs[4 * b]);
    if (QT == QD_Q6_K) {
      const __m256 Pl = _mm256_cvtepi32_ps(lo), Ph = _mm256_cvtepi32_ps(hi);
      const __m256 Dl = sD[2 * j], Dh = sD[2 * j + 1], k32 = _mm256_set1_ps(-32.f);
      acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(Pl, Dl), dx));
      acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(Ph, Dh), dx));
      accm = _mm256_add_ps(accm, _mm256_mul_ps(_mm256_mul_ps(Dl, k32), _mm256_set1_ps(xs[4 * b + 1])));
      accm = _mm256_add_ps(accm, _mm256_mul_ps(_mm256_mul_ps(Dh, k32), _mm256_set1_ps(xs[4 * b + 2])));
      continue;
    }
    const __m256 P = _mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi));   /* lane r: row r */
    __m256 D, C;
    if (QT == QD_Q4_K || QT == QD_Q5_K) {
      D = sD[j];
      C = sC[j];
    } else {
      const __m256i s = qd_halves(_mm256_i32gather_epi32((const int *)(w + o), vo, 1));
      D = _mm256_cvtph_ps(_mm256_castsi256_si128(s));
      C = qd_hasm(QT) ? _mm256_cvtph_ps(_mm256_extracti128_si256(s, 1))
                      : _mm256_mul_ps(D, _mm256_set1_ps(QT == QD_Q5_0 ? -16.f : -8.f));
    }
    acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(P, D), dx));
    if (QT != QD_Q8_0) accm = _mm256_add_ps(accm, _mm256_mul_ps(C, _mm256_set1_ps(xs[4 * b + 3])));
  }
  const __m256 out = QT == QD_Q8_0 ? acc : _mm256_add_ps(acc, accm);
  if (nr == 8) {
    _mm256_storeu_ps(y, out);
  } else {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_maskstore_ps(y, _mm256_cmpgt_epi32(_mm256_set1_epi32((int)nr), lane), out);
  }
}

#endif

/* n rows of w (rb bytes apart) against m quantized rows of x */
INLINE void qd_rows(const int QT, const uint8_t *w, i64 rb, i64 m, i64 n, i64 nb, const int16_t *xq, const f32 *xs,
                    f32 *y, i64 ldy) {
  i32 off[QD_ROWS];
  for (i64 j = 0; j < n; j += QD_ROWS) {
    const i64 nr = n - j < QD_ROWS ? n - j : QD_ROWS;
    for (i64 r = 0; r < QD_ROWS; r++) off[r] = (i32)((r < nr ? r : nr - 1) * rb);
    const uint8_t *wj = w + j * rb;
    /* the group QD_AHEAD groups on, fetched during this one's first row of x (a share per block;
     * none past the weight's end): the hardware's own prefetch left the cold decode products at
     * about 6 GB/s */
    const i64 p0 = (j + QD_AHEAD * QD_ROWS) * rb, p1 = p0 + QD_ROWS * rb < n * rb ? p0 + QD_ROWS * rb : n * rb;
    const i64 len = p1 > p0 ? p1 - p0 : 0, step = (QD_ROWS * rb + nb - 1) / nb;
    for (i64 i = 0; i < m; i++)
      qd_group(QT, wj, off, nr, nb, xq + i * nb * 32, xs + i * nb * 4, y + i * ldy + j, len ? w + p0 : w, step,
               i ? 0 : len);
  }
}

#endif /* QD_HAVE */

/* y (m rows, ldy floats apart) = x (m, k) . dequantize(w)^T, w: n rows of k elements of ggml type
 * qtype (q8_0 8, q4_0 2, q4_1 3, q5_0 6, q5_1 7, q4_k 12, q5_k 13, q6_k 14); scratch:
 * ember_qdot_scratch_bytes(m, k) bytes. Python checks the extents (16 rows of w within 2^31 bytes:
 * the gathers' 32-bit offsets). Returns 0, QD_EQTYPE, QD_ESHAPE or QD_ENOISA (nothing written then). */
EXPORT i64 ember_qdot_linear(const void *w, const f32 *x, f32 *y, i64 ldy, void *scratch, i64 qtype, i64 m, i64 n,
                             i64 k) {
#ifdef QD_I8
  if (qtype == QD_Q8_0_I8) {
    if (m < 0 || n < 0 || k < 0 || k % 32) return QD_ESHAPE;
    const i64 nb = k / 32;
    int8_t *xq = (int8_t *)scratch;
    f32 *xd = (f32 *)(xq + ((m * k + 63) & ~(i64)63));
    i32 *xc = (i32 *)(xd + m * nb);
    for (i64 i = 0; i < m; i++) qd_quantize_row_i8(x + i * k, k, xq + i * k, xd + i * nb, xc + i * nb);
    qd_rows_i8((const uint8_t *)w, m, n, nb, xq, xd, xc, y, ldy);
    return 0;
  }
#endif
  if (qtype != QD_Q8_0 && qtype != QD_Q4_0 && qtype != QD_Q4_1 && qtype != QD_Q5_0 && qtype != QD_Q5_1 &&
      qtype != QD_Q4_K && qtype != QD_Q5_K && qtype != QD_Q6_K)
    return QD_EQTYPE;
  if (m < 0 || n < 0 || k < 0 || k % (qtype >= QD_Q4_K ? 256 : 32)) return QD_ESHAPE;
#if QD_HAVE
  const i64 nb = k / 32;
  int16_t *xq = (int16_t *)scratch;
  f32 *xs = (f32 *)(xq + m * k);
  for (i64 i = 0; i < m; i++) qd_quantize_row(x + i * k, k, qtype != QD_Q8_0, xq + i * k, xs + i * nb * 4);
  const uint8_t *wb = (const uint8_t *)w;
  if (qtype == QD_Q8_0) qd_rows(QD_Q8_0, wb, nb * 34, m, n, nb, xq, xs, y, ldy);
  else if (qtype == QD_Q4_1) qd_rows(QD_Q4_1, wb, nb * 20, m, n, nb, xq, xs, y, ldy);
  else if (qtype == QD_Q4_0) qd_rows(QD_Q4_0, wb, nb * 18, m, n, nb, xq, xs, y, ldy);
  else if (qtype == QD_Q5_0) qd_rows(QD_Q5_0, wb, nb * 22, m, n, nb, xq, xs, y, ldy);
  else if (qtype == QD_Q5_1) qd_rows(QD_Q5_1, wb, nb * 24, m, n, nb, xq, xs, y, ldy);
  else if (qtype == QD_Q4_K) qd_rows(QD_Q4_K, wb, nb / 8 * 144, m, n, nb, xq, xs, y, ldy);
  else if (qtype == QD_Q5_K) qd_rows(QD_Q5_K, wb, nb / 8 * 176, m, n, nb, xq, xs, y, ldy);
  else qd_rows(QD_Q6_K, wb, nb / 8 * 210, m, n, nb, xq, xs, y, ldy);
  return 0;
#else
  (void)w, (void)x, (void)y, (void)ldy, (void)scratch;
  return QD_ENOISA;
#endif
}

EXPORT i64 ember_qdot_i8(void) {
#ifdef QD_I8
  return 1;
#else
  return 0;
#endif
}
