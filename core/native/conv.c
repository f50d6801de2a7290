/* Depthwise 2-D convolution (groups == input channels, any depth multiplier, stride, padding and
 * dilation), float32 NCHW, the bias added in the same pass: numpy_nn._conv2d's native path.
 *
 * Per input plane (one image's channel), the plane is first copied into a zero-padded scratch
 * plane of whole padded rows, each row split into its `sw` column phases (phase p holds padded
 * columns p, p + sw, p + 2 sw, ...: stride 2 is deinterleaved once here). Output column x of tap
 * (i, j) then reads padded row r * sh + i * dh, phase (j * dw) % sw, index x + (j * dw) / sw: for
 * consecutive x a contiguous run of one phase row, with no edge case (the padding is zeros and
 * every phase row is long enough for whole vectors of 8 outputs). The padding is zeroed once per
 * call (it sits at the same places for every plane), and every output channel of a plane (its
 * `mult` multipliers) is computed from its copy.
 *
 * The outputs are computed a block at a time, the kernel's taps the loop inside: R output rows by
 * V vectors of 8 columns, up to 16 accumulators (ROWS2 below; a 7x7 plane is one vector wide,
 * so its blocks are rows). The last block of rows and of columns is moved back to end at the
 * plane's edge, recomputing a few outputs to the same bits, so that only rows narrower than 16
 * store a partial vector.
 *
 * Order of the float32 math, per output: acc = bias (0 without one), then acc += w[i][j] * x for
 * the taps in row-major order (i, then j), fused multiply-adds (this file is compiled with FP
 * contraction; on a CPU without FMA, a multiply then an add). Padding taps multiply zeros, as a
 * zero-padded direct sum does. A plane's outputs do not depend on which planes a call is given, so
 * results are the same bits on any number of threads.
 *
 * Measured (Zen 4, one core, hot caches): 13-24 GFMA lanes/s on MobileNetV3's and PP-OCR's
 * shapes; stride-2 layers are about half copying (the deinterleave reads the whole input once).
 */
#include "ember_native.h"
#include <string.h>

#if defined(__clang__)
#pragma clang fp contract(fast)
#elif defined(__GNUC__)
/* (and no loop turned into a memset/memcpy call: the runs here are short) */
#pragma GCC optimize("fp-contract=fast", "no-tree-loop-distribute-patterns")
#endif
/* (vectors are passed only between static inline functions: no ABI to keep, where a target
 * without 32-byte vector registers would warn about one; gcc and clang) */
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

typedef f32 v8 __attribute__((vector_size(32)));
typedef f32 v8u __attribute__((vector_size(32), aligned(4)));   /* an unaligned load or store */

#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define HAVE_SHUFFLE 1     /* (GCC 12+, clang: the stride-2 deinterleave by vectors) */
#endif
#endif

#define VL 8
#define MAX_TAPS 256
#define MAX_STRIDE 16      /* column stride: phases of a padded row */

#if defined(__AVX512VL__)
#include <immintrin.h>
/* lanes [0, n) of p, 0 < n < 8, by masked loads/stores (no access to the other lanes) */
INLINE v8 load_part(const f32 *p, i64 n) { return (v8)_mm256_maskz_loadu_ps((__mmask8)((1u << n) - 1), p); }
INLINE void store_part(f32 *p, v8 v, i64 n) { _mm256_mask_storeu_ps(p, (__mmask8)((1u << n) - 1), (__m256)v); }
#elif defined(__AVX2__)
#include <immintrin.h>
/* (AVX2's masked store is slow on some CPUs, but still faster than n scalar stores) */
/* lanes [0, n) of p, 0 < n < 8, with AVX2's masked load/store (no access to the other lanes) */
INLINE __m256i lanes(i64 n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
INLINE v8 load_part(const f32 *p, i64 n) { return (v8)_mm256_maskload_ps(p, lanes(n)); }
INLINE void store_part(f32 *p, v8 v, i64 n) { _mm256_maskstore_ps(p, lanes(n), (__m256)v); }
#else
INLINE v8 load_part(const f32 *p, i64 n) {
  v8 v = {0, 0, 0, 0, 0, 0, 0, 0};
  for (i64 l = 0; l < n; l++) v[l] = p[l];
  return v;
}
INLINE void store_part(f32 *p, v8 v, i64 n) {
  for (i64 l = 0; l < n; l++) p[l] = v[l];
}
#endif

/* geometry (one int64 array, so that a call converts few ctypes arguments):
 *   [0] n  [1] c  [2] h  [3] w           input (N, C, H, W)
 *   [4..7] the input's strides in elements (N, C, H, W; any sign)
 *   [8] mult  [9] oh  [10] ow           output (N, C * mult, oh, ow), C-contiguous
 *   [11] kh  [12] kw  [13] sh  [14] sw  [15] dh  [16] dw  [17] pt  [18] pl
 * (the bottom and right padding follow from oh and ow) */
enum { G_N, G_C, G_H, G_W, G_SN, G_SC, G_SH, G_SW, G_MULT, G_OH, G_OW, G_KH, G_KW, G_STH, G_STW,
       G_DH, G_DW, G_PT, G_PL, G_LEN };

typedef struct {
  i64 hp, L, pitch;   /* padded rows read, phase row length, floats per padded row (sw * L) */
} layout;

static layout plane_layout(const i64 *g) {
  layout s;
  i64 nv = (g[G_OW] + VL - 1) / VL;
  s.hp = (g[G_OH] - 1) * g[G_STH] + (g[G_KH] - 1) * g[G_DH] + 1;
  s.L = nv * VL + ((g[G_KW] - 1) * g[G_DW]) / g[G_STW] + VL;   /* (+ VL: fill_plane's last store) */
  s.pitch = g[G_STW] * s.L;
  return s;
}

/* floats of scratch one thread needs (one padded plane), or -1 for a geometry the kernel does
 * not take (a non-positive size, stride or dilation, more than MAX_TAPS taps or a column stride
 * above MAX_STRIDE: numpy_nn checks the same before it calls) */
static i64 scratch_floats(const i64 *g) {
  for (int k = 0; k < G_LEN; k++)
    if (k != G_SN && k != G_SC && k != G_SH && k != G_SW && k != G_PT && k != G_PL && g[k] <= 0) return -1;
  if (g[G_KH] * g[G_KW] > MAX_TAPS || g[G_STW] > MAX_STRIDE) return -1;
  layout s = plane_layout(g);
  return s.hp * s.pitch;
}

/* where each phase's input values go: index k of phase p holds input column k * sw + p - pl,
 * inside the row for k in [k0, k0 + m) */
typedef struct {
  i64 k0[MAX_STRIDE], m[MAX_STRIDE], src[MAX_STRIDE];   /* src: the input offset of index k0 */
} phases;

static phases plane_phases(const i64 *g, layout s) {
  phases f;
  const i64 w = g[G_W], sw = g[G_STW], pl = g[G_PL];
  for (i64 p = 0; p < sw; p++) {
    i64 k0 = pl - p > 0 ? (pl - p + sw - 1) / sw : 0;
    i64 t = w - 1 + pl - p;
    i64 k1 = t < 0 ? 0 : t / sw + 1;
    if (k1 > s.L) k1 = s.L;
    f.k0[p] = k0;
    f.m[p] = k1 > k0 ? k1 - k0 : 0;
    f.src[p] = (k0 * sw + p - pl) * g[G_SW];
  }
  return f;
}

/* input plane `x` into the padded, phase-split plane P (see the top), whose padding is already
 * zero: only the input's values are written, the same positions for every plane */
static void fill_plane(f32 *P, const f32 *x, const i64 *g, layout s, const phases *f) {
  const i64 h = g[G_H], xh = g[G_SH], xw = g[G_SW], sw = g[G_STW], pt = g[G_PT], L = s.L;
  const i64 q0 = pt > 0 ? pt : 0, q1 = pt + h < s.hp ? pt + h : s.hp;
  for (i64 q = q0; q < q1; q++) {
    const f32 *xr = x + (q - pt) * xh;
    f32 *row = P + q * s.pitch;
    for (i64 p = 0; p < sw; p++) {
      const i64 m = f->m[p];
      f32 *d = row + p * L + f->k0[p];
      const f32 *src = xr + f->src[p];
      i64 k = 0;
      if (xw == 1 && sw == 1) {
        for (; k + VL <= m; k += VL) *(v8u *)(d + k) = *(const v8u *)(src + k);
        if (k < m) *(v8u *)(d + k) = load_part(src + k, m - k);   /* (zeros after: padding) */
      } else if (xw == 1 && sw == 2) {
        /* src[2k] for 8 k at a time from two vectors, while both lie inside the row (the row
         * holds 2 m - 1 values from src on) */
#ifdef HAVE_SHUFFLE
        for (; 2 * k + 2 * VL <= 2 * m - 1; k += VL) {
          v8 a = *(const v8u *)(src + 2 * k), b = *(const v8u *)(src + 2 * k + VL);
          *(v8u *)(d + k) = __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14);
        }
        if (k < m) {            /* the last r <= 8: 2 r - 1 values from src + 2 k on */
          const i64 r = m - k, n = 2 * r - 1;
          v8 a = n >= VL ? *(const v8u *)(src + 2 * k) : load_part(src + 2 * k, n);
          v8 b = n > VL ? load_part(src + 2 * k + VL, n - VL) : (v8){0, 0, 0, 0, 0, 0, 0, 0};
          *(v8u *)(d + k) = __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14);   /* (zeros after r) */
        }
#else
        for (; k < m; k++) d[k] = src[2 * k];
#endif
      } else {
        const i64 step = sw * xw;
        for (; k < m; k++) d[k] = src[k * step];
      }
    }
  }
}

/* rows of a two-vector block: 8 (16 accumulators) where there are 32 vector registers
 * (AVX-512VL), else 4 (8 accumulators, with 16 registers). A fused multiply-add's latency needs
 * about 16 independent sums to keep both FMA units of a recent x86 core busy (measured here,
 * Zen 4: 8 accumulators ~28, 16 ~60 GFMA lanes/s) */
#if defined(__AVX512VL__)
#define ROWS2 8
#define WIDE_CASES(CALL) case 4: CALL(4, 2); return; case 5: CALL(5, 2); return; \
                         case 6: CALL(6, 2); return; case 7: CALL(7, 2); return;
#else
#define ROWS2 4
#define WIDE_CASES(CALL)
#endif

/* what a block of one output plane reads: the plane's weights and bias, the padded plane's floats
 * per output row, the taps' offsets in it, the output row length */
typedef struct {
  const f32 *wk;
  f32 bias;
  i64 rstep, ntaps, ow;
  const i64 *toff;
} plane_args;

/* stores the block's accumulators: rows [0, R) of `y`, columns [x0, x0 + 8 V) (the part before
 * ow) */
#define STORE_BLOCK(R, V, acc, y, ow, x0)                                                          \
  for (int r = 0; r < R; r++)                                                                      \
    for (int v = 0; v < V; v++) {                                                                  \
      i64 col = x0 + v * VL;                                                                       \
      f32 *d = y + r * ow + col;                                                                   \
      if (col + VL <= ow)                                                                          \
        *(v8u *)d = acc[r][v];                                                                     \
      else                                                                                         \
        store_part(d, acc[r][v], ow - col);                                                        \
    }

/* outputs [x0, x0 + 8 V) of rows [0, R) of one output plane `y`, from the padded plane at `src`
 * (the block's first output row and column): per tap (in order) one broadcast weight and R x V
 * loads, each a row's start plus the tap's offset (an addressing mode: no integer work per
 * multiply-add) */
INLINE void block(const int R, const int V, const plane_args *a, const f32 *src, f32 *y, i64 x0) {
  v8 acc[ROWS2 > 8 ? ROWS2 : 8][2];
  const f32 b = a->bias;
  for (int r = 0; r < R; r++)
    for (int v = 0; v < V; v++) acc[r][v] = (v8){b, b, b, b, b, b, b, b};
  const f32 *rp[ROWS2 > 8 ? ROWS2 : 8];   /* each row's start: a load is then row + tap offset + v */
  for (int r = 0; r < R; r++) rp[r] = src + r * a->rstep;
  for (i64 t = 0; t < a->ntaps; t++) {
    const f32 wt = a->wk[t];
    const v8 wv = {wt, wt, wt, wt, wt, wt, wt, wt};
    const i64 o = a->toff[t];
    for (int r = 0; r < R; r++)
      for (int v = 0; v < V; v++) acc[r][v] += wv * *(const v8u *)(rp[r] + o + v * VL);
  }
  STORE_BLOCK(R, V, acc, y, a->ow, x0)
}

typedef void (*block_fn)(int R, int V, const plane_args *a, const f32 *src, f32 *y, i64 x0);

/* block() for R rows (1..8) and V vectors (1, 2; R <= ROWS2 when V == 2) as compile-time constants */
#define BLOCK_RV(name, CALL)                                                                       \
  static void name(int R, int V, const plane_args *a, const f32 *src, f32 *y, i64 x0) {            \
    if (V == 2) {                                                                                  \
      switch (R) {                                                                                 \
        case 1: CALL(1, 2); return;                                                                \
        case 2: CALL(2, 2); return;                                                                \
        case 3: CALL(3, 2); return;                                                                \
        WIDE_CASES(CALL)                                                                           \
        default: CALL(ROWS2, 2); return;                                                           \
      }                                                                                            \
    }                                                                                              \
    switch (R) {                                                                                   \
      case 1: CALL(1, 1); return;                                                                  \
      case 2: CALL(2, 1); return;                                                                  \
      case 3: CALL(3, 1); return;                                                                  \
      case 4: CALL(4, 1); return;                                                                  \
      case 5: CALL(5, 1); return;                                                                  \
      case 6: CALL(6, 1); return;                                                                  \
      case 7: CALL(7, 1); return;                                                                  \
      default: CALL(8, 1); return;                                                                 \
    }                                                                                              \
  }
#define ANY(R, V) block(R, V, a, src, y, x0)
BLOCK_RV(block_any, ANY)

/* Planes [p0, p1) of the N * C input planes (plane b * C + c) into their `mult` output planes
 * each: y[b, c * mult + m] = act(bias[c * mult + m] + sum of the taps) (see the top). `w` is the
 * C-contiguous (C * mult, kh * kw) float32 kernel, `bias` (C * mult,) or NULL, `y` the
 * C-contiguous output, `act` one of dense.c's activation codes 0-4 with `ap` its parameters (a,
 * b, lo, hi), applied by dense.c's ember_activation to each output plane while it is in the
 * cache (the same bits as a pass after the convolution), `scratch` this call's own
 * `scratch_len` floats (two calls at once need two). Returns 0; or, with nothing written, the
 * scratch length needed when `scratch_len` is smaller, or -1 for a geometry the kernel does not
 * take (scratch_floats, an unknown activation). */
EXPORT i64 ember_conv_depthwise_act(const f32 *x, const f32 *w, const f32 *bias, f32 *y, const i64 *g,
                                    const f32 *ap, i64 act, f32 *scratch, i64 scratch_len, i64 p0, i64 p1) {
  const i64 need = scratch_floats(g);
  if (need < 0 || act < 0 || act > 4) return -1;
  if (scratch_len < need) return need;
  const layout s = plane_layout(g);
  const i64 c = g[G_C], mult = g[G_MULT], oh = g[G_OH], ow = g[G_OW], kh = g[G_KH], kw = g[G_KW];
  const i64 sh = g[G_STH], sw = g[G_STW], dh = g[G_DH], dw = g[G_DW];
  const i64 ntaps = kh * kw, rstep = sh * s.pitch, nv = (ow + VL - 1) / VL;
  i64 toff[MAX_TAPS];
  for (i64 i = 0; i < kh; i++)
    for (i64 j = 0; j < kw; j++)
      toff[i * kw + j] = i * dh * s.pitch + ((j * dw) % sw) * s.L + (j * dw) / sw;
  const phases f = plane_phases(g, s);
  plane_args a = {.rstep = rstep, .ntaps = ntaps, .ow = ow, .toff = toff};
  /* rows per block: at most 8 (one vector) or ROWS2 (two), as even as the plane's rows allow
   * (14 rows: two blocks of 7, not 8 and a moved-back 8) */
  const i64 rmax = nv == 1 ? 8 : ROWS2, nblk = (oh + rmax - 1) / rmax;
  const int rows_max = (int)((oh + nblk - 1) / nblk);
  /* column blocks: 16 columns at a time, then the rest as one block moved left to end at the
   * last column (computing some columns again, to the same bits); a row narrower than 16 ends
   * in a partial vector */
  const i64 rem = ow % (2 * VL), xe = ow - rem;
  memset(scratch, 0, (size_t)need * sizeof(f32));   /* the padding, once: fill_plane keeps it */
  for (i64 b = p0 / c, ci = p0 % c, p = p0; p < p1; p++) {
    fill_plane(scratch, x + b * g[G_SN] + ci * g[G_SC], g, s, &f);
    for (i64 m = 0; m < mult; m++) {
      const i64 o = ci * mult + m;
      a.wk = w + o * ntaps;
      a.bias = bias ? bias[o] : 0.0f;
      f32 *yo = y + (b * c * mult + o) * oh * ow;
      /* blocks of rows_max rows; the last one moved up to end at the last row (it computes some
       * rows again, to the same bits), unless the plane has fewer rows */
      for (i64 r0 = 0; r0 < oh; r0 += rows_max) {
        const int R = (int)(oh < rows_max ? oh : rows_max);
        const i64 ra = r0 + R > oh ? oh - R : r0;
        const f32 *src = scratch + ra * rstep;
        f32 *yr = yo + ra * ow;
        for (i64 x0 = 0; x0 < xe; x0 += 2 * VL) block_any(R, 2, &a, src + x0, yr, x0);
        if (rem > VL && ow >= 2 * VL)
          block_any(R, 2, &a, src + ow - 2 * VL, yr, ow - 2 * VL);
        else if (rem > VL)
          block_any(R, 2, &a, src, yr, 0);                   /* (8 < ow < 16: the second vector partial) */
        else if (rem > 0)
          block_any(R, 1, &a, src + (ow >= VL ? ow - VL : 0), yr, ow >= VL ? ow - VL : 0);
      }
      if (act) ember_activation(yo, oh * ow, act, ap);
    }
    if (++ci == c) ci = 0, b++;
  }
  return 0;
}

/* ember_conv_depthwise_act without an activation */
EXPORT i64 ember_conv_depthwise(const f32 *x, const f32 *w, const f32 *bias, f32 *y, const i64 *g, f32 *scratch,
                                i64 scratch_len, i64 p0, i64 p1) {
  return ember_conv_depthwise_act(x, w, bias, y, g, NULL, 0, scratch, scratch_len, p0, p1);
}
