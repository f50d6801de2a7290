/* Dense convolution as a matrix product with its epilogue: numpy_nn._conv2d's native path for
 * groups-1 convolutions (1x1 ones read the input itself, others their im2col columns).
 *
 *   Y[o, p] = act(bias[o] + sum_k W[o, k] X[k, p])      o < M, k < K, p in [n0, n1)
 *
 * W comes packed (once per weight, by Python): panels of 8 output rows, each k-major, rows past M
 * zero: wp[(o / 8) * K * 8 + k * 8 + o % 8]. X is K rows of at least n1 floats, `ldx` apart (the
 * input planes of a 1x1 convolution: no copy); Y is M rows `ldy` apart.
 *
 * The product is computed in blocks of 8 output rows by two vectors of VW columns (16
 * accumulators: 8 x 32 with AVX-512), k the loop inside: per k two loads of X and 16
 * multiply-adds with the 8 weights broadcast. The block's X columns (K x 32 floats) are read
 * from the caches for every panel of 8 rows. The last block of columns loads and stores only its
 * lanes (masks with AVX-512, else a copy through a local vector).
 *
 * Order of the float32 math, per output: acc = 0, acc += W[o, k] * X[k, p] for k ascending (fused
 * multiply-adds: this file is compiled with FP contraction; without FMA, a multiply then an add),
 * then acc + bias, then the activation:
 *   0 none, 1 relu max(v, 0), 2 clip min(max(v, lo), hi), 3 hard sigmoid clip(v * a + b, 0, 1),
 *   4 hard swish v * clip(v * a + b, 0, 1)
 * each step rounded as numpy's clip / multiply / add round it: the same bits as the plan's separate
 * activation steps on the same product (NaN stays NaN, -0 stays -0 as in numpy's clip). A column's outputs do not depend
 * on the range a call is given, so results are the same bits on any number of threads.
 */
#include "vec.h"

#if defined(__clang__)
#pragma clang fp contract(fast)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=fast", "no-tree-loop-distribute-patterns")
#endif

#define MR 8          /* output rows per packed panel and per block */
#define NR (2 * VW)   /* columns per block */

enum { G_M, G_K, G_N, G_LDX, G_LDY, G_ACT, G_LEN };
/* (the activations of vec.h's finish() these kernels take: codes 0-4) */
#define DENSE_ACTS (ACT_HARD_SWISH + 1)

/* One call of BLOCK(NV, LAST, ACT) (a macro the caller defines just before) with the block's vector
 * count, last vector's width and the activation as constants, so that each combination becomes its
 * own inlined loop; reads `act` and VW. */
#define BLOCK_ACTS(NV, LAST)                                                      \
  switch (act) {                                                                  \
    case ACT_NONE: BLOCK(NV, LAST, ACT_NONE); break;                              \
    case ACT_RELU: BLOCK(NV, LAST, ACT_RELU); break;                              \
    case ACT_CLIP: BLOCK(NV, LAST, ACT_CLIP); break;                              \
    case ACT_HARD_SIGMOID: BLOCK(NV, LAST, ACT_HARD_SIGMOID); break;              \
    default: BLOCK(NV, LAST, ACT_HARD_SWISH); break;                              \
  }
#define BLOCKS(nv, last)                                                          \
  do {                                                                            \
    if ((nv) == 2 && (last) == VW) {                                              \
      BLOCK_ACTS(2, VW)                                                           \
    } else if ((nv) == 2) {                                                       \
      BLOCK_ACTS(2, last)                                                         \
    } else {                                                                      \
      BLOCK_ACTS(1, last)                                                         \
    }                                                                             \
  } while (0);

/* the block's 16 accumulators, one k's step (x row `xr`, weights `wk`) and the epilogue */
#define ACC_DECL                                                                                  \
  vf a00 = {0}, a01 = {0}, a10 = {0}, a11 = {0}, a20 = {0}, a21 = {0}, a30 = {0}, a31 = {0};      \
  vf a40 = {0}, a41 = {0}, a50 = {0}, a51 = {0}, a60 = {0}, a61 = {0}, a70 = {0}, a71 = {0};      \
  const int whole = last == VW;
#define ACC_STEP(xr, wk)                                                                          \
  {                                                                                               \
    vf x0, x1 = {0};                                                                              \
    if (nv == 2) {                                                                                \
      x0 = load(xr);                                                                              \
      x1 = whole ? load((xr) + VW) : load_part((xr) + VW, last);                                  \
    } else {                                                                                      \
      x0 = whole ? load(xr) : load_part(xr, last);                                                \
    }                                                                                             \
    a00 += (wk)[0] * x0; a10 += (wk)[1] * x0; a20 += (wk)[2] * x0; a30 += (wk)[3] * x0;           \
    a40 += (wk)[4] * x0; a50 += (wk)[5] * x0; a60 += (wk)[6] * x0; a70 += (wk)[7] * x0;           \
    if (nv == 2) {                                                                                \
      a01 += (wk)[0] * x1; a11 += (wk)[1] * x1; a21 += (wk)[2] * x1; a31 += (wk)[3] * x1;         \
      a41 += (wk)[4] * x1; a51 += (wk)[5] * x1; a61 += (wk)[6] * x1; a71 += (wk)[7] * x1;         \
    }                                                                                             \
  }
#define ACC_STORE                                                                                 \
  vf acc[MR][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}, {a40, a41}, {a50, a51}, {a60, a61}, {a70, a71}}; \
  for (i64 r = 0; r < rows; r++) {                                                                \
    f32 *yr = y + r * ldy;                                                                        \
    f32 b = bias ? bias[r] : 0.0f;                                                                \
    for (int v = 0; v < nv; v++) {                                                                \
      vf o = finish(acc[r][v], bias != NULL, b, act, ap);                                         \
      if (v == nv - 1 && !whole) store_part(yr + v * VW, o, last);                                \
      else store(yr + v * VW, o);                                                                 \
    }                                                                                             \
  }

/* one block: rows [o0, o0 + rows) (rows <= MR) of panel `w`, columns [j, j + VW * (nv - 1) + last)
 * of X and Y; nv is 1 or 2 vectors, the last one `last` lanes (VW: a whole vector) */
INLINE void block(const f32 *w, const f32 *x, f32 *y, const f32 *bias, i64 K, i64 ldx, i64 ldy, i64 rows,
                  int nv, i64 last, int act, const f32 *ap) {
  ACC_DECL
  for (i64 k = 0; k < K; k++) ACC_STEP(x + k * ldx, w + k * MR)
  ACC_STORE
}

/* the same block with X's row k = (c * kh + i) * kw + j at x + c * sc + i * si + j * sj: the taps
 * of a zero-padded input read in place (ember_conv_rows) */
INLINE void block_taps(const f32 *w, const f32 *x, f32 *y, const f32 *bias, i64 C, i64 kh, i64 kw, i64 sc,
                       i64 si, i64 sj, i64 ldy, i64 rows, int nv, i64 last, int act, const f32 *ap) {
  ACC_DECL
  for (i64 c = 0; c < C; c++)
    for (i64 i = 0; i < kh; i++) {
      const f32 *xi = x + c * sc + i * si;
      for (i64 j = 0; j < kw; j++, w += MR) ACC_STEP(xi + j * sj, w)
    }
  ACC_STORE
}

/* Columns [n0, n1) of Y (see the top). geom: [0] M [1] K [2] N [3] ldx [4] ldy [5] activation;
 * ap: the activation's parameters [a, b, lo, hi] (read for codes 2-4). Returns 0, or -1 with
 * nothing written for a geometry it does not take (numpy_nn checks the same before it calls). */
EXPORT i64 ember_conv_gemm(const f32 *wp, const f32 *x, const f32 *bias, f32 *y, const i64 *g, const f32 *ap,
                           i64 n0, i64 n1) {
  const i64 M = g[G_M], K = g[G_K], N = g[G_N], ldx = g[G_LDX], ldy = g[G_LDY], act = g[G_ACT];
  if (M <= 0 || K <= 0 || N <= 0 || ldx < N || ldy < N || act < 0 || act >= DENSE_ACTS || n0 < 0 || n1 > N ||
      n0 > n1)
    return -1;
  const i64 panels = (M + MR - 1) / MR;
  for (i64 j = n0; j < n1; j += NR) {
    const i64 left = n1 - j;
    const int nv = left > VW ? 2 : 1;
    const i64 last = left >= NR ? VW : left - (nv - 1) * VW;
    for (i64 p = 0; p < panels; p++) {
      const i64 o0 = p * MR, rows = M - o0 < MR ? M - o0 : MR;
      const f32 *w = wp + p * K * MR;
      const f32 *b = bias ? bias + o0 : NULL;
      f32 *yb = y + o0 * ldy + j;
      /* (constant nv / whole / act per call below: the compiler makes each its own loop) */
#define BLOCK(NV, LAST, ACT) block(w, x + j, yb, b, K, ldx, ldy, rows, NV, LAST, ACT, ap)
      BLOCKS(nv, last)
#undef BLOCK
    }
  }
  return 0;
}

/* ---- direct: the im2col columns made a block at a time ---------------------------------------
 *
 * For a convolution of K = C * kh * kw <= DIRECT_MAX_K taps per output (the caller's scratch
 * `panel` holds K x 32 floats), each block of up to 32 output pixels (row-major, across rows) gets its K x 32
 * column panel gathered into a local buffer (zeros where a tap reads padding), then the product
 * above runs on it: no im2col matrix in memory. The same order of math per output as the product
 * (the panel holds the same values im2col would). Stride-2 rows are deinterleaved by vectors
 * (AVX-512) where a whole run of 32 lies inside the row. */
#define DIRECT_MAX_K 4096
#define DIRECT_ROW_PANEL 16384   /* floats of a row's panel at most (K x ow: within L1 + L2's reach) */

enum { D_C, D_H, D_W, D_SC, D_SH, D_SW, D_O, D_OH, D_OW, D_KH, D_KW, D_STH, D_STW, D_DH, D_DW, D_PT, D_PL, D_ACT,
       D_LEN };

/* panel row: out[t] = x[(x0 + t) * sw - pl + j * dw] along one input row (zero outside [0, w)) */
static void gather(f32 *out, const f32 *xr, i64 xs, i64 w, i64 x0, i64 nc, i64 sw, i64 off) {
  /* input column of output t: (x0 + t) * sw + off; inside for t in [t0, t1) */
  i64 first = x0 * sw + off;
  i64 t0 = first >= 0 ? 0 : (-first + sw - 1) / sw;
  i64 t1 = w - first > 0 ? (w - first + sw - 1) / sw : 0;
  if (t1 > nc) t1 = nc;
  if (t0 > t1) t0 = t1;
  for (i64 t = 0; t < t0; t++) out[t] = 0;
  const f32 *src = xr + first * xs;
  i64 t = t0;
  if (xs == 1 && sw == 1) {
    memcpy(out + t0, src + t0, (size_t)(t1 - t0) * 4);
    t = t1;
  }
#if defined(__AVX512F__)
  else if (xs == 1 && sw == 2) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    for (; t + 16 <= t1; t += 16) {   /* (the two loads read input columns first + 2t .. first + 2t + 31) */
      if (first + 2 * t + 31 > w - 1) break;
      __m512 a = _mm512_loadu_ps(src + 2 * t), b = _mm512_loadu_ps(src + 2 * t + 16);
      _mm512_storeu_ps(out + t, _mm512_permutex2var_ps(a, even, b));
    }
  }
#endif
  for (; t < t1; t++) out[t] = src[t * sw * xs];
  for (t = t1; t < nc; t++) out[t] = 0;
}

/* Output rows [r0, r1) of one image's convolution (see above). geom: [0] C [1] H [2] W, [3..5] the
 * input's element strides (C, H, W), [6] O [7] oh [8] ow [9] kh [10] kw [11] sh [12] sw [13] dh
 * [14] dw [15] pt [16] pl [17] activation; panel: scratch of panel_len >= K * NR floats (with K * ow
 * rounded up to NR or more and rows of NR or more: a row at a time); wp packed as for ember_conv_gemm with K = C * kh * kw
 * (k = (c * kh + i) * kw + j); y (O, oh, ow) C-contiguous. [r0, r1): a range of output pixels
 * (row-major), blocks of 32 of them from r0 (a block may span output rows). Returns 0, or -1 with
 * nothing written for a geometry it does not take. */
EXPORT i64 ember_conv_direct(const f32 *wp, const f32 *x, const f32 *bias, f32 *y, const i64 *g, const f32 *ap,
                             f32 *panel, i64 panel_len, i64 r0, i64 r1) {
  const i64 C = g[D_C], H = g[D_H], W = g[D_W], O = g[D_O], oh = g[D_OH], ow = g[D_OW], kh = g[D_KH], kw = g[D_KW];
  const i64 sh = g[D_STH], sw = g[D_STW], dh = g[D_DH], dw = g[D_DW], act = g[D_ACT];
  const i64 K = C * kh * kw;
  if (C <= 0 || H <= 0 || W <= 0 || O <= 0 || oh <= 0 || ow <= 0 || kh <= 0 || kw <= 0 || sh <= 0 || sw <= 0 ||
      dh <= 0 || dw <= 0 || K > DIRECT_MAX_K || panel_len < K * NR || act < 0 || act >= DENSE_ACTS || r0 < 0 || r1 > oh * ow || r0 > r1)
    return -1;
  const i64 panels = (O + MR - 1) / MR, npix = oh * ow;
  const i64 owp = (ow + NR - 1) / NR * NR;
  if (ow >= NR && K * owp <= DIRECT_ROW_PANEL && panel_len >= K * owp) {
    /* rows at least a block wide: the panel holds the range's part of one output row (K rows of
     * up to owp columns, owp apart), each of its K rows gathered in one run, then the blocks of
     * NR columns read it (the same values in each block as below: the same bits). MobileNetV3's
     * 3->16 3x3 stride-2 convolution at 224x224: 205 -> ~110 us on one core (the blocks' gathers
     * were mostly bookkeeping per row of 32 pixels) */
    for (i64 r = r0 / ow; r * ow < r1; r++) {
      const i64 xa = r0 > r * ow ? r0 - r * ow : 0, xb = r1 - r * ow < ow ? r1 - r * ow : ow, n = xb - xa;
      for (i64 c = 0, k = 0; c < C; c++)
        for (i64 i = 0; i < kh; i++) {
          const i64 iy = r * sh - g[D_PT] + i * dh;
          for (i64 j = 0; j < kw; j++, k++) {
            if (iy < 0 || iy >= H)
              memset(panel + k * owp, 0, (size_t)n * 4);
            else
              gather(panel + k * owp, x + c * g[D_SC] + iy * g[D_SH], g[D_SW], W, xa, n, sw, j * dw - g[D_PL]);
          }
        }
      for (i64 j0 = 0; j0 < n; j0 += NR) {
        const i64 left = n - j0;
        const int nv = left > VW ? 2 : 1;
        const i64 last = left >= NR ? VW : left - (nv - 1) * VW;
        for (i64 p = 0; p < panels; p++) {
          const i64 o0 = p * MR, rows = O - o0 < MR ? O - o0 : MR;
          const f32 *w = wp + p * K * MR;
          const f32 *b = bias ? bias + o0 : NULL;
          f32 *yb = y + o0 * npix + r * ow + xa + j0;
#define BLOCK(NV, LAST, ACT) block(w, panel + j0, yb, b, K, owp, npix, rows, NV, LAST, ACT, ap)
          BLOCKS(nv, last)
#undef BLOCK
        }
      }
    }
    return 0;
  }
  for (i64 pb = r0; pb < r1; pb += NR) {
    {
      const i64 nc = r1 - pb < NR ? r1 - pb : NR;
      for (i64 c = 0, k = 0; c < C; c++)
        for (i64 i = 0; i < kh; i++)
          for (i64 j = 0; j < kw; j++, k++) {
            f32 *row = panel + k * NR;
            /* the block's pixels, a run of one output row at a time */
            for (i64 t = 0; t < nc;) {
              const i64 r = (pb + t) / ow, x0 = (pb + t) % ow;
              const i64 seg = nc - t < ow - x0 ? nc - t : ow - x0;
              const i64 iy = r * sh - g[D_PT] + i * dh;
              if (iy < 0 || iy >= H)
                memset(row + t, 0, (size_t)seg * 4);
              else
                gather(row + t, x + c * g[D_SC] + iy * g[D_SH], g[D_SW], W, x0, seg, sw, j * dw - g[D_PL]);
              t += seg;
            }
          }
      const int nv = nc > VW ? 2 : 1;
      const i64 last = nc == NR ? VW : nc - (nv - 1) * VW;
      for (i64 p = 0; p < panels; p++) {
        const i64 o0 = p * MR, rows = O - o0 < MR ? O - o0 : MR;
        const f32 *w = wp + p * K * MR;
        const f32 *b = bias ? bias + o0 : NULL;
        f32 *yb = y + o0 * npix + pb;
#define BLOCK(NV, LAST, ACT) block(w, panel, yb, b, K, NR, npix, rows, NV, LAST, ACT, ap)
        BLOCKS(nv, last)
#undef BLOCK
      }
    }
  }
  return 0;
}

/* y[i] = act(y[i]) for i < n, in place (the activations of ember_conv_gemm's epilogue, without a
 * bias: the same bits as numpy's steps); for the convolutions the product above does not make.
 * Returns 0, or -1 for an unknown activation. */
EXPORT i64 ember_activation(f32 *y, i64 n, i64 act, const f32 *ap) {
  if (act < 0 || act >= DENSE_ACTS || n < 0) return -1;
  i64 i = 0;
#define ACT_LOOP(ACT)                                                                                 \
  for (; i + VW <= n; i += VW) store(y + i, finish(load(y + i), 0, 0.0f, ACT, ap));                        \
  if (i < n) store_part(y + i, finish(load_part(y + i, n - i), 0, 0.0f, ACT, ap), n - i);
  switch (act) {
    case ACT_NONE: break;
    case ACT_RELU: ACT_LOOP(ACT_RELU) break;
    case ACT_CLIP: ACT_LOOP(ACT_CLIP) break;
    case ACT_HARD_SIGMOID: ACT_LOOP(ACT_HARD_SIGMOID) break;
    default: ACT_LOOP(ACT_HARD_SWISH) break;
  }
#undef ACT_LOOP
  return 0;
}

/* ---- rows: stride-1 convolutions of many taps on a zero-padded input, read in place ------------
 *
 * The input comes padded (C, Hp, Wp), C-contiguous; output row r, columns [x0, x0 + 32) read for
 * tap (c, i, j) the run at c * Hp * Wp + (r + i * dh) * Wp + j * dw + x0: no copy at all. Blocks
 * stay within one output row (the last of a row: its lanes only). Same order of math as above. */
enum { R_C, R_HP, R_WP, R_O, R_OH, R_OW, R_KH, R_KW, R_DH, R_DW, R_ACT, R_LEN };

/* Output rows [r0, r1). geom: [0] C [1] Hp [2] Wp [3] O [4] oh [5] ow [6] kh [7] kw [8] dh [9] dw
 * [10] activation; wp packed as for ember_conv_gemm with K = C * kh * kw; y (O, oh, ow)
 * C-contiguous. Returns 0, or -1 with nothing written for a geometry it does not take. */
EXPORT i64 ember_conv_rows(const f32 *wp, const f32 *x, const f32 *bias, f32 *y, const i64 *g, const f32 *ap,
                           i64 r0, i64 r1) {
  const i64 C = g[R_C], Hp = g[R_HP], Wp = g[R_WP], O = g[R_O], oh = g[R_OH], ow = g[R_OW], kh = g[R_KH];
  const i64 kw = g[R_KW], dh = g[R_DH], dw = g[R_DW], act = g[R_ACT];
  if (C <= 0 || O <= 0 || oh <= 0 || ow <= 0 || kh <= 0 || kw <= 0 || dh <= 0 || dw <= 0 ||
      oh + (kh - 1) * dh > Hp || ow + (kw - 1) * dw > Wp || act < 0 || act >= DENSE_ACTS || r0 < 0 || r1 > oh ||
      r0 > r1)
    return -1;
  const i64 K = C * kh * kw, panels = (O + MR - 1) / MR, npix = oh * ow, plane = Hp * Wp;
  for (i64 r = r0; r < r1; r++)
    for (i64 x0 = 0; x0 < ow; x0 += NR) {
      const i64 nc = ow - x0 < NR ? ow - x0 : NR;
      const int nv = nc > VW ? 2 : 1;
      const i64 last = nc == NR ? VW : nc - (nv - 1) * VW;
      const f32 *xb = x + r * Wp + x0;
      for (i64 p = 0; p < panels; p++) {
        const i64 o0 = p * MR, rows = O - o0 < MR ? O - o0 : MR;
        const f32 *w = wp + p * K * MR;
        const f32 *b = bias ? bias + o0 : NULL;
        f32 *yb = y + o0 * npix + r * ow + x0;
#define BLOCK(NV, LAST, ACT) block_taps(w, xb, yb, b, C, kh, kw, plane, dh * Wp, dw, npix, rows, NV, LAST, ACT, ap)
        BLOCKS(nv, last)
#undef BLOCK
      }
    }
  return 0;
}

/* ---- padded: small stride-1 convolutions from a zero-padded band the kernel copies, 2x2 max pool -
 *
 * For the small convolutions of a small network (MNIST's 1->16 3x3 at 28x28 and 16->32 3x3 at
 * 14x14), where the im2col + BLAS path is mostly Python and copies, and ember_conv_rows's blocks
 * would fill few lanes. A call first copies the input rows its output rows read into `scratch`: C
 * planes of `band` rows by Wp = ow + (kw - 1) dw floats, zeros where a tap reads padding (so no
 * padded copy is made in Python). Tap (c, i, j) of output row r, column x then reads band row
 * r + i dh, column x + j dw of plane c: for a run of columns, a run of the band.
 *
 * Blocks are 8 output channels by two vectors: the same columns [x0, x0 + nc) (nc <= VW) of output
 * rows r and r + 1 (16 accumulators as in the product above, also for planes narrower than a
 * vector: 14 columns fill 14 of 16 lanes, not half of two vectors). A last unpaired row is a block
 * of one vector. Loads are whole vectors (the lanes past nc read further along the band, or the VW
 * floats of slack after it, and are never stored).
 *
 * pool 2: the activation's result max-pooled over 2x2 windows of stride 2 in the epilogue (the
 * plan's conv2d, activation, max_pool2d as one step): y is (O, oh / 2, ow / 2), rows and columns
 * past an even count are not computed (numpy's floor mode). The maximum is numpy's (np.maximum:
 * NaN when either is NaN), first over the window's two rows, then over its two columns, as
 * numpy_nn._max_pool_tiled takes them.
 *
 * Order of the float32 math per convolution output: as the product above (k = (c * kh + i) * kw + j
 * ascending from 0, fused multiply-adds, then + bias, then the activation): the same bits as
 * ember_conv_rows and ember_conv_direct on the same convolution. Outputs do not depend on the
 * range a call is given.
 *
 * Units: pairs of output rows (pooled rows when pooling) of the N images, unit u = image u / U,
 * pair u % U, U = oh / 2 pooling, else (oh + 1) / 2. */
enum { Q_N, Q_C, Q_H, Q_W, Q_SN, Q_SC, Q_SH, Q_SW, Q_O, Q_OH, Q_OW, Q_KH, Q_KW, Q_DH, Q_DW, Q_PT, Q_PL, Q_ACT,
       Q_POOL, Q_LEN };

/* numpy's maximum of two float32 vectors: a where a is NaN, else a > b ? a : b (b where b is NaN;
 * AVX-512's max is that second part) */
INLINE vf maxn(vf a, vf b) {
#if defined(__AVX512F__)
  const __mmask16 nan = _mm512_cmp_ps_mask((__m512)a, (__m512)a, _CMP_UNORD_Q);
  return (vf)_mm512_mask_mov_ps(_mm512_max_ps((__m512)a, (__m512)b), nan, (__m512)a);
#else
  return sel(a != a, a, sel(a > b, a, b));
#endif
}

/* band row d[0, Wp): d[j] = s[(j - pl) * sw] where 0 <= j - pl < W, else 0 (`s`: the input row) */
INLINE void pad_row(f32 *d, const f32 *s, i64 sw, i64 W, i64 pl, i64 Wp) {
#if defined(__AVX512F__)
  if (sw == 1) {   /* a vector at a time: masked loads of the row's lanes (no access to the others) */
    for (i64 j = 0; j < Wp; j += VW) {
      const i64 lo = pl - j > 0 ? pl - j : 0, hi = W + pl - j < VW ? W + pl - j : VW;
      const __mmask16 in = hi > lo ? (__mmask16)(((1u << (hi - lo)) - 1) << lo) : 0;
      const __mmask16 out = (__mmask16)(Wp - j >= VW ? 0xffffu : (1u << (Wp - j)) - 1);
      _mm512_mask_storeu_ps(d + j, out, _mm512_maskz_loadu_ps(in, (const char *)s + (j - pl) * 4));
    }
    return;
  }
#endif
  const i64 j0 = pl < 0 ? 0 : pl > Wp ? Wp : pl, j1 = pl + W < j0 ? j0 : pl + W > Wp ? Wp : pl + W;
  memset(d, 0, (size_t)j0 * 4);
  if (sw == 1)
    memcpy(d + j0, s + (j0 - pl), (size_t)(j1 - j0) * 4);
  else
    for (i64 j = j0; j < j1; j++) d[j] = s[(j - pl) * sw];
  memset(d + j1, 0, (size_t)(Wp - j1) * 4);
}

/* lanes i < VW / 2: maxn(v[2 i], v[2 i + 1]) (the other lanes: anything) */
INLINE vf pair_max(vf v) {
#if defined(__AVX512F__)
  const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14);
  const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 1, 3, 5, 7, 9, 11, 13, 15);
  return maxn((vf)_mm512_permutexvar_ps(ev, (__m512)v), (vf)_mm512_permutexvar_ps(od, (__m512)v));
#else
  f32 t[VW], e[VW] = {0}, o[VW] = {0};
  memcpy(t, &v, sizeof t);
  for (int i = 0; i < VW / 2; i++) e[i] = t[2 * i], o[i] = t[2 * i + 1];
  vf ve, vo;
  memcpy(&ve, e, sizeof ve);
  memcpy(&vo, o, sizeof vo);
  return maxn(ve, vo);
#endif
}

/* one block: output channels [o0, o0 + rows) of panel `w`, output rows r (and r + 1 when nv is 2),
 * columns [x0, x0 + nc); `xb` is the band at row r, column x0 of plane 0; tap (c, i, j) at
 * xb + c * sc + i * si + j * sj, the second row at + Wp. y: the block's first output (channel o0,
 * row r or pooled row r / 2, column x0 or x0 / 2), ldo floats per output channel, Wo per row. */
INLINE void block_pad(const f32 *w, const f32 *xb, f32 *y, const f32 *bias, i64 C, i64 kh, i64 kw, i64 sc,
                      i64 si, i64 sj, i64 Wp, i64 ldo, i64 Wo, i64 rows, int nv, i64 nc, int act, int pool,
                      const f32 *ap) {
  vf a00 = {0}, a01 = {0}, a10 = {0}, a11 = {0}, a20 = {0}, a21 = {0}, a30 = {0}, a31 = {0};
  vf a40 = {0}, a41 = {0}, a50 = {0}, a51 = {0}, a60 = {0}, a61 = {0}, a70 = {0}, a71 = {0};
  for (i64 c = 0; c < C; c++)
    for (i64 i = 0; i < kh; i++) {
      const f32 *xi = xb + c * sc + i * si;
      for (i64 j = 0; j < kw; j++, w += MR) {
        const vf x0 = load(xi + j * sj);
        a00 += w[0] * x0; a10 += w[1] * x0; a20 += w[2] * x0; a30 += w[3] * x0;
        a40 += w[4] * x0; a50 += w[5] * x0; a60 += w[6] * x0; a70 += w[7] * x0;
        if (nv == 2) {
          const vf x1 = load(xi + j * sj + Wp);
          a01 += w[0] * x1; a11 += w[1] * x1; a21 += w[2] * x1; a31 += w[3] * x1;
          a41 += w[4] * x1; a51 += w[5] * x1; a61 += w[6] * x1; a71 += w[7] * x1;
        }
      }
    }
  vf acc[MR][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}, {a40, a41}, {a50, a51}, {a60, a61}, {a70, a71}};
  for (i64 q = 0; q < rows; q++) {
    f32 *yq = y + q * ldo;
    const f32 b = bias ? bias[q] : 0.0f;
    const vf v0 = finish(acc[q][0], bias != NULL, b, act, ap);
    if (pool) {
      const vf v1 = finish(acc[q][1], bias != NULL, b, act, ap);
      store_part(yq, pair_max(maxn(v0, v1)), nc / 2);
      continue;
    }
    if (nc == VW) store(yq, v0);
    else store_part(yq, v0, nc);
    if (nv == 2) {
      const vf v1 = finish(acc[q][1], bias != NULL, b, act, ap);
      if (nc == VW) store(yq + Wo, v1);
      else store_part(yq + Wo, v1, nc);
    }
  }
}

/* Units [u0, u1) (see above). geom: [0] N [1] C [2] H [3] W, [4..7] the input's element strides
 * (N, C, H, W), [8] O [9] oh [10] ow (the convolution's output) [11] kh [12] kw [13] dh [14] dw
 * [15] pt [16] pl (the top and left padding; the rest follows from oh, ow) [17] activation [18]
 * pool (0, or 2: 2x2 max pooling); wp packed as for ember_conv_gemm with K = C * kh * kw; y (N, O,
 * oh, ow), pooled (N, O, oh / 2, ow / 2), C-contiguous; scratch: scratch_len floats of this call's
 * own. Returns 0; or, with nothing written, the scratch length needed when scratch_len is smaller,
 * or -1 for a geometry it does not take. */
EXPORT i64 ember_conv_pad(const f32 *wp, const f32 *x, const f32 *bias, f32 *y, const i64 *g, const f32 *ap,
                          f32 *scratch, i64 scratch_len, i64 u0, i64 u1) {
  const i64 N = g[Q_N], C = g[Q_C], H = g[Q_H], W = g[Q_W], O = g[Q_O], oh = g[Q_OH], ow = g[Q_OW];
  const i64 kh = g[Q_KH], kw = g[Q_KW], dh = g[Q_DH], dw = g[Q_DW], pt = g[Q_PT], pl = g[Q_PL];
  const i64 act = g[Q_ACT], pool = g[Q_POOL];
  if (N <= 0 || C <= 0 || H <= 0 || W <= 0 || O <= 0 || oh <= 0 || ow <= 0 || kh <= 0 || kw <= 0 || dh <= 0 ||
      dw <= 0 || act < 0 || act >= DENSE_ACTS || (pool != 0 && pool != 2) || (pool && (oh < 2 || ow < 2)))
    return -1;
  const i64 U = pool ? oh / 2 : (oh + 1) / 2, rows_used = pool ? 2 * U : oh, cols = pool ? ow / 2 * 2 : ow;
  if (u0 < 0 || u1 > N * U || u0 > u1) return -1;
  const i64 Wp = ow + (kw - 1) * dw, halo = (kh - 1) * dh;
  const i64 most = 2 * (u1 - u0) < rows_used ? 2 * (u1 - u0) : rows_used;
  const i64 need = C * (most + halo) * Wp + VW;
  if (scratch_len < need) return need;
  const i64 Wo = pool ? ow / 2 : ow, ldo = (pool ? oh / 2 : oh) * Wo, panels = (O + MR - 1) / MR;
  for (i64 u = u0; u < u1;) {
    const i64 b = u / U, pa = u % U, pb = U - pa < u1 - u ? U : pa + (u1 - u);
    const i64 ra = 2 * pa, rb = 2 * pb < rows_used ? 2 * pb : rows_used, band = rb - ra + halo;
    /* the band: padded rows [ra, ra + band) of each plane (padded row q is input row q - pt, padded
     * column j input column j - pl) */
    for (i64 c = 0; c < C; c++)
      for (i64 t = 0; t < band; t++) {
        const i64 iy = ra + t - pt;
        if (iy < 0 || iy >= H)
          memset(scratch + (c * band + t) * Wp, 0, (size_t)Wp * 4);
        else
          pad_row(scratch + (c * band + t) * Wp, x + b * g[Q_SN] + c * g[Q_SC] + iy * g[Q_SH], g[Q_SW], W, pl, Wp);
      }
    memset(scratch + C * band * Wp, 0, VW * 4);     /* (the slack whole-vector loads may read) */
    f32 *yb = y + b * O * ldo;
    for (i64 r = ra; r < rb; r += 2) {
      const int nv = r + 1 < rb ? 2 : 1;
      for (i64 x0 = 0; x0 < cols; x0 += VW) {
        const i64 nc = cols - x0 < VW ? cols - x0 : VW;
        const f32 *xb = scratch + (r - ra) * Wp + x0;
        for (i64 p = 0; p < panels; p++) {
          const i64 o0 = p * MR, rows = O - o0 < MR ? O - o0 : MR;
          const f32 *w = wp + p * C * kh * kw * MR;
          const f32 *bp = bias ? bias + o0 : NULL;
          f32 *yo = yb + o0 * ldo + (pool ? (r / 2) * Wo + x0 / 2 : r * Wo + x0);
#define PAD_BLOCK(NV, POOL, ACT) \
  block_pad(w, xb, yo, bp, C, kh, kw, band * Wp, dh * Wp, dw, Wp, ldo, Wo, rows, NV, nc, ACT, POOL, ap)
#define PAD_ACTS(NV, POOL)                                                        \
  switch (act) {                                                                  \
    case ACT_NONE: PAD_BLOCK(NV, POOL, ACT_NONE); break;                          \
    case ACT_RELU: PAD_BLOCK(NV, POOL, ACT_RELU); break;                          \
    case ACT_CLIP: PAD_BLOCK(NV, POOL, ACT_CLIP); break;                          \
    case ACT_HARD_SIGMOID: PAD_BLOCK(NV, POOL, ACT_HARD_SIGMOID); break;          \
    default: PAD_BLOCK(NV, POOL, ACT_HARD_SWISH); break;                          \
  }
          if (pool) {
            PAD_ACTS(2, 1)
          } else if (nv == 2) {
            PAD_ACTS(2, 0)
          } else {
            PAD_ACTS(1, 0)
          }
#undef PAD_ACTS
#undef PAD_BLOCK
        }
      }
    }
    u += pb - pa;
  }
  return 0;
}

/* ---- matrix-vector: one output pixel / one row of a linear --------------------------------------
 *
 *   y[o] = act(bias[o] + sum_k W[o, k] x[k])      o in [o0, o1)
 *
 * W is row-major (M, K), rows K apart (a 1x1 convolution's or a linear's weight as it is: no packed
 * copy), x K contiguous floats, y M floats. The packed kernels above use 1 lane of 16 for one
 * column; here 8 rows are read at once (then 4, then 1), each into its own VW-lane accumulator:
 * eight independent chains of multiply-adds (MNIST's 1568 -> 64 layer 6.3 -> 3.8 us with 8 rows
 * instead of 4; the same bits, each row's sum unchanged).
 * Order of the float32 math, per output: lane l sums W[o, k] x[k] for k = l, l + VW, ... ascending
 * (vmadd: fused where the CPU has FMA; written out because, left to contraction, GCC's Zen tuning
 * fused the 4- and 8-row loops but not the one-row loop; the last vector of a row its lanes only),
 * then the lanes pairwise (lane i += lane i + h for h = VW / 2, ..., 1), then + bias, then the
 * activation, rounded as above. Bits do
 * not depend on the row range. Returns 0, or -1 with nothing written for a geometry it does not
 * take. geom: [0] M [1] K [2] N (must be 1) [3] ldx [4] ldy (unused) [5] activation. */
INLINE f32 hsum(vf v) {
  f32 t[VW];
  memcpy(t, &v, sizeof t);
  for (int h = VW / 2; h > 0; h /= 2)
    for (int i = 0; i < h; i++) t[i] += t[i + h];
  return t[0];
}

EXPORT i64 ember_gemv(const f32 *w, const f32 *x, const f32 *bias, f32 *y, const i64 *g, const f32 *ap, i64 o0,
                      i64 o1) {
  const i64 M = g[G_M], K = g[G_K], act = g[G_ACT];
  if (M <= 0 || K <= 0 || g[G_N] != 1 || act < 0 || act >= DENSE_ACTS || o0 < 0 || o1 > M || o0 > o1) return -1;
  const i64 kv = K / VW * VW, tail = K - kv;
  i64 o = o0;
  for (; o + 8 <= o1; o += 8) {
    const f32 *w0 = w + o * K;
    vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
    for (i64 k = 0; k < kv; k += VW) {
      const vf xv = load(x + k);
      const f32 *wk = w0 + k;
      a0 = vmadd(load(wk), xv, a0); a1 = vmadd(load(wk + K), xv, a1);
      a2 = vmadd(load(wk + 2 * K), xv, a2); a3 = vmadd(load(wk + 3 * K), xv, a3);
      a4 = vmadd(load(wk + 4 * K), xv, a4); a5 = vmadd(load(wk + 5 * K), xv, a5);
      a6 = vmadd(load(wk + 6 * K), xv, a6); a7 = vmadd(load(wk + 7 * K), xv, a7);
    }
    if (tail) {
      const vf xv = load_part(x + kv, tail);
      const f32 *wk = w0 + kv;
      a0 = vmadd(load_part(wk, tail), xv, a0); a1 = vmadd(load_part(wk + K, tail), xv, a1);
      a2 = vmadd(load_part(wk + 2 * K, tail), xv, a2); a3 = vmadd(load_part(wk + 3 * K, tail), xv, a3);
      a4 = vmadd(load_part(wk + 4 * K, tail), xv, a4); a5 = vmadd(load_part(wk + 5 * K, tail), xv, a5);
      a6 = vmadd(load_part(wk + 6 * K, tail), xv, a6); a7 = vmadd(load_part(wk + 7 * K, tail), xv, a7);
    }
    y[o] = hsum(a0); y[o + 1] = hsum(a1); y[o + 2] = hsum(a2); y[o + 3] = hsum(a3);
    y[o + 4] = hsum(a4); y[o + 5] = hsum(a5); y[o + 6] = hsum(a6); y[o + 7] = hsum(a7);
  }
  for (; o + 4 <= o1; o += 4) {
    const f32 *w0 = w + o * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
    vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    for (i64 k = 0; k < kv; k += VW) {
      const vf xv = load(x + k);
      a0 = vmadd(load(w0 + k), xv, a0); a1 = vmadd(load(w1 + k), xv, a1);
      a2 = vmadd(load(w2 + k), xv, a2); a3 = vmadd(load(w3 + k), xv, a3);
    }
    if (tail) {
      const vf xv = load_part(x + kv, tail);
      a0 = vmadd(load_part(w0 + kv, tail), xv, a0); a1 = vmadd(load_part(w1 + kv, tail), xv, a1);
      a2 = vmadd(load_part(w2 + kv, tail), xv, a2); a3 = vmadd(load_part(w3 + kv, tail), xv, a3);
    }
    y[o] = hsum(a0); y[o + 1] = hsum(a1); y[o + 2] = hsum(a2); y[o + 3] = hsum(a3);
  }
  for (; o < o1; o++) {
    const f32 *w0 = w + o * K;
    vf a0 = {0};
    for (i64 k = 0; k < kv; k += VW) a0 = vmadd(load(w0 + k), load(x + k), a0);
    if (tail) a0 = vmadd(load_part(w0 + kv, tail), load_part(x + kv, tail), a0);
    y[o] = hsum(a0);
  }
  /* the epilogue over [o0, o1): + bias, then the activation (ember_conv_gemm's, vector by vector) */
  for (i64 i = o0; i < o1; i += VW) {
    const i64 n = o1 - i < VW ? o1 - i : VW;
    vf v = n == VW ? load(y + i) : load_part(y + i, n);
    if (bias) v = v + (n == VW ? load(bias + i) : load_part(bias + i, n));
    switch (act) {
      case ACT_NONE: break;
      case ACT_RELU: v = finish(v, 0, 0.0f, ACT_RELU, ap); break;
      case ACT_CLIP: v = finish(v, 0, 0.0f, ACT_CLIP, ap); break;
      case ACT_HARD_SIGMOID: v = finish(v, 0, 0.0f, ACT_HARD_SIGMOID, ap); break;
      default: v = finish(v, 0, 0.0f, ACT_HARD_SWISH, ap); break;
    }
    if (n == VW) store(y + i, v);
    else store_part(y + i, v, n);
  }
  return 0;
}
