/* Shared by gemm.c, conv.c and pool.c (the linalg family; see ember/wasm/ops_linalg.py, which
 * mirrors every number defined here). */
#ifndef EMBER_LINALG_H
#define EMBER_LINALG_H
#include "ember.h"

/* flags of gemm / gemm_nt / conv2d_* */
#define GEMM_BIAS_MASK 3
#define GEMM_BIAS_COL 1      /* bias[j] added to column j (linear) */
#define GEMM_BIAS_ROW 2      /* bias[i] added to row i (conv2d: one output channel per row) */
#define GEMM_RELU 4          /* max(x, 0) before the store (NaN passes) */
#define GEMM_ACCUMULATE 8    /* C += A · B instead of C = A · B (+ bias) */
#define CONV_IM2COL 16       /* conv2d_gemm: always im2col + gemm, never the direct form (tests) */

#define GEMM_NR 8            /* columns per packed panel of B */
#define GEMM_MR 4            /* rows of A per microkernel call */
#define GEMM_KC 384          /* K is cut into blocks of KC (a 384-deep slice of a panel is 12 KB of L1) */
#define GEMM_MC 96           /* rows of A per block (reused by every panel of B) */
/* gemm's packed modes: floats of scratch past B's panels for A's packed block */
#define GEMM_APACK(M, K) ((((M) < GEMM_MC ? (M) : GEMM_MC) + GEMM_MR - 1) / GEMM_MR * GEMM_MR * ((K) < GEMM_KC ? (K) : GEMM_KC))
#define GEMM_APACK_MIN_N (2 * GEMM_NR)   /* A is packed only for more columns than this */

/* how gemm reads B (see gemm.c) */
#define GEMM_B_KN_DIRECT 0
#define GEMM_B_KN_PACKED 1
#define GEMM_B_NK_PACKED 2
#define GEMM_B_NK_DOT 3

/* gemm's int32 parameter table; the offset tables follow it */
enum { GP_M, GP_N, GP_K, GP_LDA, GP_LDB, GP_LDC, GP_FLAGS, GP_BMODE, GP_NB, GP_NBB, GP_CSTRIDE, GP_NPARAMS };

/* B (K, N), row stride ldb -> packed panels of GEMM_NR columns (zero padded). */
void gemm_pack_rows(const f32 *B, i32 ldb, f32 *P, i32 K, i32 N);
/* W (N, K), row stride ldw (B = W^T) -> the same panels. */
void gemm_pack_cols(const f32 *W, i32 ldw, f32 *P, i32 K, i32 N);
/* C (M, N; ldc) = A (M, K; lda) · packed P (+ bias, relu per flags). */
void gemm_packed_one(const f32 *A, i32 lda, const f32 *P, f32 *C, i32 ldc, i32 M, i32 N, i32 K,
                     const f32 *bias, i32 flags);
/* the same with a row-major B (rows ldb apart) read in place; T: its last N % 8 columns packed. */
void gemm_direct_one(const f32 *A, i32 lda, const f32 *B, i32 ldb, const f32 *T, f32 *C, i32 ldc, i32 M,
                     i32 N, i32 K, const f32 *bias, i32 flags);
/* C = A · W^T for a (N, K) W (rows ldw apart) by dot products, no packing (few rows of A). */
void gemm_dot_one(const f32 *A, i32 lda, const f32 *W, i32 ldw, f32 *C, i32 ldc, i32 M, i32 N, i32 K,
                  const f32 *bias, i32 flags);

/* acc += a * b. The plain module: a float32 multiply, then an add (two roundings). The relaxed
 * module (kernels_relaxed.wasm, built with -mrelaxed-simd): f32x4.relaxed_madd, which the engine
 * runs fused (one rounding) where the CPU has FMA and as the plain pair where it does not; either
 * way the same for every element and call in one engine, so every split of a product (threads,
 * row blocks, packed or in-place A) still gives the same bits within one module. */
#ifdef __wasm_relaxed_simd__
#define FMA(acc, a, b) acc = wasm_f32x4_relaxed_madd(a, b, acc)
#else
#define FMA(acc, a, b) acc = wasm_f32x4_add(acc, wasm_f32x4_mul(a, b))
#endif

/* n (1..8) floats of lo, hi stored at c. */
INLINE void store_n(f32 *c, i32 n, f32x4 lo, f32x4 hi) {
  if (n == 8) {
    wasm_v128_store(c, lo);
    wasm_v128_store(c + 4, hi);
    return;
  }
  if (n >= 4) {
    wasm_v128_store(c, lo);
    c += 4;
    n -= 4;
    lo = hi;
  }
  if (n >= 2) {
    wasm_v128_store64_lane(c, lo, 0);
    lo = wasm_i64x2_shuffle(lo, lo, 1, 1);
    c += 2;
    n -= 2;
  }
  if (n) wasm_v128_store32_lane(c, lo, 0);
}

/* conv2d_gemm copies a group's planes, zero padded, only up to this many floats (conv.c) */
#define CONV_PAD_MAX (1 << 18)

/* the int32 parameter table of conv2d_gemm / conv2d_depthwise */
enum {
  CONV_N, CONV_C, CONV_H, CONV_W, CONV_O, CONV_GROUPS, CONV_KH, CONV_KW, CONV_SH, CONV_SW,
  CONV_PT, CONV_PL, CONV_DH, CONV_DW, CONV_OH, CONV_OW, CONV_CHUNK, CONV_FLAGS, CONV_NPARAMS
};

#endif
