/* Matrix products in float32: C = A · B (+ bias) (relu), the core of matmul, linear and conv2d.
 *
 * The 4x8 register-blocked microkernel reads B in panels of NR = 8 columns: packed (k-major,
 * zero padded: from a row-major (K, N) B or from a (N, K) one such as a linear weight, or
 * written directly by im2col in conv.c), or read in place from a row-major B for products with
 * few rows, where packing would cost more than it saves. K is cut into blocks of KC so a panel's
 * slice stays in L1 while MC rows of A reuse it. A's rows are read in place, or, where gemm has
 * scratch for them and B has enough panels to repay the copy, packed per (KC, MC) block into
 * groups of MR rows interleaved by k: the microkernel's four splat loads then share one pointer
 * and their offsets fold into the loads (V8: no address arithmetic per row and step; ~3%).
 * For a (N, K) B and few rows there is a second kernel: dot products of A's rows with B's rows.
 * Python makes one call per op (``gemm``, with a batch of products and offset tables).
 *
 * Semantics: float32 multiply and add (no FMA; the relaxed module: relaxed_madd, see FMA below),
 * summed in k order within a block; NaN and inf
 * propagate as in any float32 dot product. Padding lanes of the last panel are computed but never
 * stored. */
#include "ember.h"
#include "linalg.h"
#include "team.h"

#define MR GEMM_MR
#define NR GEMM_NR
#define KC GEMM_KC
#define MC GEMM_MC

/* ---- packing ------------------------------------------------------------------------------ */

/* B (K, N) with row stride ldb -> panels P[(j / NR) * K * NR + k * NR + j % NR], zero padded. */
static void pack_kn(const f32 *B, i32 ldb, f32 *P, i32 K, i32 N) {
  const i32 full = N / NR;
  for (i32 jp = 0; jp < full; jp++) {
    const f32 *b = B + jp * NR;
    f32 *p = P + jp * K * NR;
    for (i32 k = 0; k < K; k++) {
      wasm_v128_store(p, wasm_v128_load(b));
      wasm_v128_store(p + 4, wasm_v128_load(b + 4));
      b += ldb;
      p += NR;
    }
  }
  const i32 rest = N - full * NR;
  if (rest) {
    const f32 *b = B + full * NR;
    f32 *p = P + full * K * NR;
    for (i32 k = 0; k < K; k++) {
      i32 j = 0;
      for (; j < rest; j++) p[j] = b[j];
      for (; j < NR; j++) p[j] = 0.f;
      b += ldb;
      p += NR;
    }
  }
}

/* W (N, K) with row stride ldw (B = W^T) -> the same panels: 8 rows of W become one panel,
 * transposed 4x4 blocks at a time. */
static void pack_nk(const f32 *W, i32 ldw, f32 *P, i32 K, i32 N) {
  const i32 full = N / NR;
  for (i32 jp = 0; jp < full; jp++) {
    const f32 *w = W + jp * NR * ldw;
    f32 *p = P + jp * K * NR;
    i32 k = 0;
    for (; k + 4 <= K; k += 4) {
      for (i32 h = 0; h < 2; h++) {
        const f32 *r = w + h * 4 * ldw + k;
        f32x4 r0 = wasm_v128_load(r), r1 = wasm_v128_load(r + ldw);
        f32x4 r2 = wasm_v128_load(r + 2 * ldw), r3 = wasm_v128_load(r + 3 * ldw);
        f32x4 t0 = wasm_i32x4_shuffle(r0, r1, 0, 4, 1, 5), t1 = wasm_i32x4_shuffle(r2, r3, 0, 4, 1, 5);
        f32x4 t2 = wasm_i32x4_shuffle(r0, r1, 2, 6, 3, 7), t3 = wasm_i32x4_shuffle(r2, r3, 2, 6, 3, 7);
        f32 *q = p + k * NR + h * 4;
        wasm_v128_store(q, wasm_i64x2_shuffle(t0, t1, 0, 2));
        wasm_v128_store(q + NR, wasm_i64x2_shuffle(t0, t1, 1, 3));
        wasm_v128_store(q + 2 * NR, wasm_i64x2_shuffle(t2, t3, 0, 2));
        wasm_v128_store(q + 3 * NR, wasm_i64x2_shuffle(t2, t3, 1, 3));
      }
    }
    for (; k < K; k++)
      for (i32 j = 0; j < NR; j++) p[k * NR + j] = w[j * ldw + k];
  }
  const i32 rest = N - full * NR;
  if (rest) {
    const f32 *w = W + full * NR * ldw;
    f32 *p = P + full * K * NR;
    for (i32 k = 0; k < K; k++) {
      i32 j = 0;
      for (; j < rest; j++) p[k * NR + j] = w[j * ldw + k];
      for (; j < NR; j++) p[k * NR + j] = 0.f;
    }
  }
}

/* Rows [0, mr) of A (row stride lda; mr <= MR) times kc columns -> Q[k * MR + r], rows past mr
 * zero (computed by the microkernel, never stored). 4x4 blocks transposed with shuffles. */
static void pack_a(const f32 *A, i32 lda, f32 *Q, i32 mr, i32 kc) {
  if (mr == MR) {
    const f32 *r0 = A, *r1 = A + lda, *r2 = A + 2 * lda, *r3 = A + 3 * lda;
    i32 k = 0;
    for (; k + 4 <= kc; k += 4) {
      const f32x4 a0 = wasm_v128_load(r0 + k), a1 = wasm_v128_load(r1 + k);
      const f32x4 a2 = wasm_v128_load(r2 + k), a3 = wasm_v128_load(r3 + k);
      const f32x4 t0 = wasm_i32x4_shuffle(a0, a1, 0, 4, 1, 5), t1 = wasm_i32x4_shuffle(a2, a3, 0, 4, 1, 5);
      const f32x4 t2 = wasm_i32x4_shuffle(a0, a1, 2, 6, 3, 7), t3 = wasm_i32x4_shuffle(a2, a3, 2, 6, 3, 7);
      f32 *q = Q + k * MR;
      wasm_v128_store(q, wasm_i64x2_shuffle(t0, t1, 0, 2));
      wasm_v128_store(q + MR, wasm_i64x2_shuffle(t0, t1, 1, 3));
      wasm_v128_store(q + 2 * MR, wasm_i64x2_shuffle(t2, t3, 0, 2));
      wasm_v128_store(q + 3 * MR, wasm_i64x2_shuffle(t2, t3, 1, 3));
    }
    for (; k < kc; k++) {
      f32 *q = Q + k * MR;
      q[0] = r0[k]; q[1] = r1[k]; q[2] = r2[k]; q[3] = r3[k];
    }
    return;
  }
  for (i32 k = 0; k < kc; k++)
    for (i32 r = 0; r < MR; r++) Q[k * MR + r] = r < mr ? A[r * lda + k] : 0.f;
}

void gemm_pack_rows(const f32 *B, i32 ldb, f32 *P, i32 K, i32 N) { pack_kn(B, ldb, P, K, N); }
void gemm_pack_cols(const f32 *W, i32 ldw, f32 *P, i32 K, i32 N) { pack_nk(W, ldw, P, K, N); }

/* ---- the 4x8 microkernel ------------------------------------------------------------------ */

/* n (1..8) floats at c as two vectors (lanes past n are zero). */
INLINE void load_n(const f32 *c, i32 n, f32x4 *lo, f32x4 *hi) {
  if (n == 8) {
    *lo = wasm_v128_load(c);
    *hi = wasm_v128_load(c + 4);
    return;
  }
  f32 v[8];   /* scalar locals: clang keeps them in registers (fully unrolled below) */
  for (i32 j = 0; j < 8; j++) v[j] = j < n ? c[j] : 0.f;
  *lo = wasm_f32x4_make(v[0], v[1], v[2], v[3]);
  *hi = wasm_f32x4_make(v[4], v[5], v[6], v[7]);
}

/* (FMA(acc, a, b): linalg.h) */

/* R (1..4, a constant after inlining) rows of A, lda apart (PK 0), or packed by pack_a (PK 1:
 * row r of step k at a[k * MR + r]; lda unused), times one slice p of B (kc rows, ldp apart, 8
 * columns) into R rows of C (ldc apart), nr columns stored. mode: what the accumulators start
 * from (INIT_*); relu: applied before the store. Both forms run the same float operations in the
 * same order: the result does not depend on PK. */
enum { INIT_ZERO = 0, INIT_COLBIAS = 1, INIT_ROWBIAS = 2, INIT_C = 3 };

#define ROWS(X) X(0) if (R > 1) X(1) if (R > 2) X(2) if (R > 3) X(3)

INLINE void micro_r(const i32 R, const i32 PK, i32 kc, const f32 *a, i32 lda, const f32 *p, i32 ldp, f32 *c,
                    i32 ldc, i32 nr, i32 mode, const f32 *bias, i32 relu) {
  const f32 *a0 = a, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
  f32 *c0 = c, *c1 = c0 + ldc, *c2 = c1 + ldc, *c3 = c2 + ldc;
  const f32x4 z = wasm_f32x4_splat(0.f);
  f32x4 x00 = z, x01 = z, x10 = z, x11 = z, x20 = z, x21 = z, x30 = z, x31 = z;
  if (mode == INIT_C) {
#define LOAD_C(r) load_n(c##r, nr, &x##r##0, &x##r##1);
    ROWS(LOAD_C)
  } else if (mode == INIT_COLBIAS) {
    load_n(bias, nr, &x00, &x01);
    x10 = x20 = x30 = x00;
    x11 = x21 = x31 = x01;
  } else if (mode == INIT_ROWBIAS) {
#define LOAD_RB(r) x##r##0 = x##r##1 = wasm_v128_load32_splat(bias + r);
    ROWS(LOAD_RB)
  }
  /* one splat load of A per row and k: faster in V8 than four-wide loads and lane shuffles, and
   * 8 accumulators + 2 B vectors + 1 splat fit x64's 16 vector registers (4x12, 6x8 spill) */
  const f32 *pend = p + kc * ldp;   /* packed A: the loop ends on B's pointer (no step count; ~2%) */
  for (i32 k = 0; PK ? p != pend : k < kc; k++) {
    const f32x4 b0 = wasm_v128_load(p), b1 = wasm_v128_load(p + 4);
#define STEP(r) { const f32x4 s = wasm_v128_load32_splat(PK ? a + r : a##r + k); FMA(x##r##0, s, b0); FMA(x##r##1, s, b1); }
    ROWS(STEP)
    p += ldp;
    if (PK) a += MR;   /* (a pointer step, not a + k * MR: V8 then spends no shift per step) */
  }
  if (relu) {
    /* pmax(x, 0) = x < 0 ? 0 : x: NaN and -0.0 pass through, as relu does elsewhere */
#define RELU(r) x##r##0 = wasm_f32x4_pmax(x##r##0, z); x##r##1 = wasm_f32x4_pmax(x##r##1, z);
    ROWS(RELU)
  }
#define STORE(r) store_n(c##r, nr, x##r##0, x##r##1);
  ROWS(STORE)
#undef LOAD_C
#undef LOAD_RB
#undef STEP
#undef RELU
#undef STORE
}

static void micro(i32 mr, i32 kc, const f32 *a, i32 lda, const f32 *p, i32 ldp, f32 *c, i32 ldc, i32 nr,
                  i32 mode, const f32 *bias, i32 relu) {
  switch (mr) {
    case 4: micro_r(4, 0, kc, a, lda, p, ldp, c, ldc, nr, mode, bias, relu); break;
    case 3: micro_r(3, 0, kc, a, lda, p, ldp, c, ldc, nr, mode, bias, relu); break;
    case 2: micro_r(2, 0, kc, a, lda, p, ldp, c, ldc, nr, mode, bias, relu); break;
    default: micro_r(1, 0, kc, a, lda, p, ldp, c, ldc, nr, mode, bias, relu); break;
  }
}

/* the same on A packed by pack_a */
static void micro_packed(i32 mr, i32 kc, const f32 *a, const f32 *p, i32 ldp, f32 *c, i32 ldc, i32 nr, i32 mode,
                         const f32 *bias, i32 relu) {
  switch (mr) {
    case 4: micro_r(4, 1, kc, a, 0, p, ldp, c, ldc, nr, mode, bias, relu); break;
    case 3: micro_r(3, 1, kc, a, 0, p, ldp, c, ldc, nr, mode, bias, relu); break;
    case 2: micro_r(2, 1, kc, a, 0, p, ldp, c, ldc, nr, mode, bias, relu); break;
    default: micro_r(1, 1, kc, a, 0, p, ldp, c, ldc, nr, mode, bias, relu); break;
  }
}

/* One product: A (M, K; row stride lda) times B into C (M, N; ldc). B's full blocks of NR columns
 * are at P + (j / NR) * pj with rows pk apart: pj = K * NR, pk = NR for packed panels; pj = NR,
 * pk = ldb for a row-major B read in place. The last partial block (N % NR columns) is always a
 * packed panel T (K x NR, zero padded): reading NR columns in place there would run past B.
 * Q: room for A's packed block (GEMM_APACK(M, K) floats), or 0 to read A in place. */
static void gemm_one(const f32 *A, i32 lda, const f32 *P, i32 pj, i32 pk, const f32 *T, f32 *C, i32 ldc,
                     i32 M, i32 N, i32 K, const f32 *bias, i32 flags, f32 *Q) {
  if (N <= GEMM_APACK_MIN_N) Q = 0;   /* too few panels to repay the copy */
  const i32 bmode = flags & GEMM_BIAS_MASK, relu = (flags & GEMM_RELU) != 0;
  const i32 acc = (flags & GEMM_ACCUMULATE) != 0;
  for (i32 kb = 0; kb < K; kb += KC) {
    const i32 kc = K - kb < KC ? K - kb : KC;
    const i32 first = kb == 0, last = kb + kc == K;
    for (i32 ib = 0; ib < M; ib += MC) {
      const i32 iend = ib + MC < M ? ib + MC : M;
      if (Q)
        for (i32 i = ib; i < iend; i += MR)
          pack_a(A + i * lda + kb, lda, Q + (i - ib) * kc, iend - i < MR ? iend - i : MR, kc);
      for (i32 j = 0; j < N; j += NR) {
        const i32 nr = N - j < NR ? N - j : NR;
        const f32 *p = nr == NR ? P + (j / NR) * pj + kb * pk : T + kb * NR;
        const i32 ldp = nr == NR ? pk : NR;
        for (i32 i = ib; i < iend; i += MR) {
          const i32 mr = iend - i < MR ? iend - i : MR;
          i32 mode = INIT_C;
          const f32 *b = 0;
          if (first && !acc) {
            mode = bmode == GEMM_BIAS_COL ? INIT_COLBIAS : bmode == GEMM_BIAS_ROW ? INIT_ROWBIAS : INIT_ZERO;
            b = bmode == GEMM_BIAS_COL ? bias + j : bmode == GEMM_BIAS_ROW ? bias + i : 0;
          }
          if (Q) micro_packed(mr, kc, Q + (i - ib) * kc, p, ldp, C + i * ldc + j, ldc, nr, mode, b, relu && last);
          else micro(mr, kc, A + i * lda + kb, lda, p, ldp, C + i * ldc + j, ldc, nr, mode, b, relu && last);
        }
      }
    }
  }
}

void gemm_packed_one(const f32 *A, i32 lda, const f32 *P, f32 *C, i32 ldc, i32 M, i32 N, i32 K,
                     const f32 *bias, i32 flags) {
  gemm_one(A, lda, P, K * NR, NR, P + (N / NR) * K * NR, C, ldc, M, N, K, bias, flags, 0);
}

/* ---- nt: rows of A against rows of W, no packing ------------------------------------------ */

INLINE f32 hsum(f32x4 v) {
  v = wasm_f32x4_add(v, wasm_i32x4_shuffle(v, v, 2, 3, 0, 1));
  v = wasm_f32x4_add(v, wasm_i32x4_shuffle(v, v, 1, 0, 3, 2));
  return wasm_f32x4_extract_lane(v, 0);
}

/* C[i, j] = sum_k A[i, k] * W[j, k] for R (1 or 2, constant after inlining) rows of A and 4 rows
 * of W (w1..w3 alias w0's block end when fewer are left: computed twice, stored once). */
INLINE void nt_block(const i32 R, const f32 *a0, const f32 *a1, const f32 *W, i32 ldw, f32 *c0, f32 *c1,
                     i32 i, i32 j, i32 N, i32 K, const f32 *bias, i32 bmode, i32 acc, i32 relu) {
  const f32 *w0 = W + j * ldw;
  const f32 *w1 = j + 1 < N ? w0 + ldw : w0, *w2 = j + 2 < N ? w1 + ldw : w1, *w3 = j + 3 < N ? w2 + ldw : w2;
  f32x4 s00 = wasm_f32x4_splat(0.f), s01 = s00, s02 = s00, s03 = s00;
  f32x4 s10 = s00, s11 = s00, s12 = s00, s13 = s00;
  i32 k = 0;
  for (; k + 4 <= K; k += 4) {
    const f32x4 x0 = wasm_v128_load(a0 + k), x1 = R > 1 ? wasm_v128_load(a1 + k) : x0;
    f32x4 w = wasm_v128_load(w0 + k); FMA(s00, x0, w); if (R > 1) FMA(s10, x1, w);
    w = wasm_v128_load(w1 + k); FMA(s01, x0, w); if (R > 1) FMA(s11, x1, w);
    w = wasm_v128_load(w2 + k); FMA(s02, x0, w); if (R > 1) FMA(s12, x1, w);
    w = wasm_v128_load(w3 + k); FMA(s03, x0, w); if (R > 1) FMA(s13, x1, w);
  }
  f32 r00 = hsum(s00), r01 = hsum(s01), r02 = hsum(s02), r03 = hsum(s03);
  f32 r10 = hsum(s10), r11 = hsum(s11), r12 = hsum(s12), r13 = hsum(s13);
  for (; k < K; k++) {
    const f32 x0 = a0[k], x1 = R > 1 ? a1[k] : 0.f;
    r00 += x0 * w0[k]; r01 += x0 * w1[k]; r02 += x0 * w2[k]; r03 += x0 * w3[k];
    if (R > 1) { r10 += x1 * w0[k]; r11 += x1 * w1[k]; r12 += x1 * w2[k]; r13 += x1 * w3[k]; }
  }
  const i32 nc = N - j < 4 ? N - j : 4;
#define OUT(q)                                                                                  \
  if (q < nc) {                                                                                 \
    f32 v0 = r0##q, v1 = r1##q;                                                                 \
    if (acc) { v0 += c0[j + q]; if (R > 1) v1 += c1[j + q]; }                                   \
    else if (bmode == GEMM_BIAS_COL) { v0 += bias[j + q]; v1 += bias[j + q]; }                  \
    else if (bmode == GEMM_BIAS_ROW) { v0 += bias[i]; if (R > 1) v1 += bias[i + 1]; }          \
    if (relu) { v0 = v0 < 0.f ? 0.f : v0; v1 = v1 < 0.f ? 0.f : v1; }                           \
    c0[j + q] = v0;                                                                             \
    if (R > 1) c1[j + q] = v1;                                                                  \
  }
  OUT(0) OUT(1) OUT(2) OUT(3)
#undef OUT
}

static void gemm_nt_one(const f32 *A, i32 lda, const f32 *W, i32 ldw, f32 *C, i32 ldc, i32 M, i32 N,
                        i32 K, const f32 *bias, i32 flags) {
  const i32 bmode = flags & GEMM_BIAS_MASK, relu = (flags & GEMM_RELU) != 0;
  const i32 acc = (flags & GEMM_ACCUMULATE) != 0;
  /* W's rows outside, A's inside: each block of 4 rows of W is read from memory once and used
   * by every row of A while it is in L1 (W is streamed once, not once per pair of rows) */
  for (i32 j = 0; j < N; j += 4) {
    i32 i = 0;
    for (; i + 2 <= M; i += 2) {
      const f32 *a0 = A + i * lda;
      f32 *c0 = C + i * ldc;
      nt_block(2, a0, a0 + lda, W, ldw, c0, c0 + ldc, i, j, N, K, bias, bmode, acc, relu);
    }
    if (i < M) {
      const f32 *a0 = A + i * lda;
      f32 *c0 = C + i * ldc;
      nt_block(1, a0, a0, W, ldw, c0, c0, i, j, N, K, bias, bmode, acc, relu);
    }
  }
}

void gemm_direct_one(const f32 *A, i32 lda, const f32 *B, i32 ldb, const f32 *T, f32 *C, i32 ldc, i32 M,
                     i32 N, i32 K, const f32 *bias, i32 flags) {
  gemm_one(A, lda, B, NR, ldb, T, C, ldc, M, N, K, bias, flags, 0);
}

void gemm_dot_one(const f32 *A, i32 lda, const f32 *W, i32 ldw, f32 *C, i32 ldc, i32 M, i32 N, i32 K,
                  const f32 *bias, i32 flags) {
  gemm_nt_one(A, lda, W, ldw, C, ldc, M, N, K, bias, flags);
}

/* ---- the entry point ---------------------------------------------------------------------- */

/* nb products C_b = A_b · B_b (+ bias) (relu), one call from Python. prm (GP_* in linalg.h) holds
 * the sizes, then three tables: aoff[nb] (element offset of A_b in A), bidx[nb] (which of the
 * nbb distinct B matrices B_b is) and boff[nbb] (their element offsets in B). C_b sits at
 * C + b * cstride with rows ldc apart. How B is read (GP_BMODE):
 *  GEMM_B_KN_DIRECT  B (K, N), rows ldb apart, read in place; each distinct B's last partial
 *                    panel is packed into S (nbb * K * NR floats);
 *  GEMM_B_KN_PACKED  B (K, N) packed into S first (nbb * panels(K, N) floats);
 *  GEMM_B_NK_PACKED  B given transposed, as W (N, K) with rows ldb apart (a linear weight),
 *                    packed into S first;
 *  GEMM_B_NK_DOT     W (N, K) as above, dot products of A's rows with W's rows (S unused).
 * In the two packed modes S holds GEMM_APACK(M, K) more floats past the panels, where A's rows are
 * packed (gemm_one's Q); on a team each thread packs its rows into its private scratch instead
 * (team.h: at least as large as S). */
/* One thread's share of the products (see team.h): packing split by panels, then a barrier, then
 * the products split by batches, rows (grains of MR) or column panels, whichever the shape has
 * enough of. Each element is computed by the same instructions whatever the split. */
void gemm_team(const f32 *A, const f32 *B, f32 *S, f32 *C, const f32 *bias, const i32 *prm, i32 *ctl, i32 tid,
               i32 nt) {
  const i32 M = prm[GP_M], N = prm[GP_N], K = prm[GP_K], lda = prm[GP_LDA], ldb = prm[GP_LDB];
  const i32 ldc = prm[GP_LDC], flags = prm[GP_FLAGS], mode = prm[GP_BMODE], nb = prm[GP_NB];
  const i32 nbb = prm[GP_NBB], cstride = prm[GP_CSTRIDE];
  const i32 *aoff = prm + GP_NPARAMS, *bidx = aoff + nb, *boff = bidx + nb;
  const i32 full = N / NR * NR, size = ((N + NR - 1) / NR) * K * NR;
  const i32 width = team_width(ctl, nt, (i64)M * N * K * nb);
  const i32 bmode = flags & GEMM_BIAS_MASK;
  i32 lo, hi;
  /* packing: panels [lo, hi) of every distinct B */
  if (mode == GEMM_B_KN_DIRECT) {
    team_range(nbb, 1, tid, width, &lo, &hi);
    if (full < N)
      for (i32 j = lo; j < hi; j++) pack_kn(B + boff[j] + full, ldb, S + j * K * NR, K, N - full);
  } else if (mode != GEMM_B_NK_DOT) {
    team_range(N, NR, tid, width, &lo, &hi);
    for (i32 j = 0; j < nbb && lo < hi; j++) {
      if (mode == GEMM_B_NK_PACKED) pack_nk(B + boff[j] + lo * ldb, ldb, S + j * size + lo * K, K, hi - lo);
      else pack_kn(B + boff[j] + lo, ldb, S + j * size + lo * K, K, hi - lo);
    }
  }
  if (width > 1) team_sync(ctl, tid, nt);
  /* the products: by batch when there are enough, else by rows, else by column panels. Where B
   * is read in place for few rows of A (NK_DOT, KN_DIRECT: a linear layer on a few tokens), a
   * split by rows has every thread stream all of B from memory, which bounds those products (a
   * MiniLM 1 x 8 forward reads 42 MB of weights for 85 M multiply-adds): there columns come first,
   * so that each thread reads its share of B only */
  const i32 grain = mode == GEMM_B_NK_DOT ? 2 : MR, cgrain = mode == GEMM_B_NK_DOT ? 4 : NR;
  const i32 in_place = mode == GEMM_B_NK_DOT || mode == GEMM_B_KN_DIRECT;
  const i32 by_batch = nb >= width;
  const i32 by_rows = !by_batch && M >= grain * width * 2 && (!in_place || N < cgrain * width * 2);
  i32 b0 = 0, b1 = nb, m0 = 0, m1 = M, n0 = 0, n1 = N;
  if (by_batch) team_range(nb, 1, tid, width, &b0, &b1);
  else if (by_rows) team_range(M, grain, tid, width, &m0, &m1);
  else team_range(N, cgrain, tid, width, &n0, &n1);
  if (m0 >= m1 || n0 >= n1) return;
  const f32 *bs = bias ? bias + (bmode == GEMM_BIAS_ROW ? m0 : bmode == GEMM_BIAS_COL ? n0 : 0) : 0;
  const i32 Mp = m1 - m0, Np = n1 - n0;
  for (i32 b = b0; b < b1; b++) {
    const f32 *Ab = A + aoff[b] + m0 * lda;
    f32 *Cb = C + b * cstride + m0 * ldc + n0;
    if (mode == GEMM_B_NK_DOT)
      gemm_nt_one(Ab, lda, B + boff[bidx[b]] + n0 * ldb, ldb, Cb, ldc, Mp, Np, K, bs, flags);
    else if (mode == GEMM_B_KN_DIRECT)
      gemm_one(Ab, lda, B + boff[bidx[b]] + n0, NR, ldb, S + bidx[b] * K * NR, Cb, ldc, Mp, Np, K, bs, flags, 0);
    else {
      const f32 *P = S + bidx[b] * size;
      /* (a team whose private scratch is too small for A's block reads A in place: same bits) */
      f32 *Q = !ctl ? S + nbb * size
               : (i64)ctl[TEAM_SCRATCH_STRIDE] >= (i64)GEMM_APACK(Mp, K) * 4 ? (f32 *)team_scratch(ctl, tid, 0) : 0;
      gemm_one(Ab, lda, P + n0 * K, K * NR, NR, P + full * K, Cb, ldc, Mp, Np, K, bs, flags, Q);
    }
  }
}

EXPORT(gemm) void gemm(const f32 *A, const f32 *B, f32 *S, f32 *C, const f32 *bias, const i32 *prm) {
  gemm_team(A, B, S, C, bias, prm, 0, 0, 1);
}
