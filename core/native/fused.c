/* Fused steps of the numpy backend's compiled plans (numpy_plan): a linear layer with what reads it
 * (ember_linear), attention over heads (ember_attention), and MobileNet's squeeze-excite after its
 * means (ember_squeeze_excite). Each replaces several plan steps (each a numpy pass, an array and
 * ~5-10 us of Python after other work has evicted the caches) by one call.
 *
 * This file is compiled without FP contraction: every fused multiply-add is written (vec.h's
 * vmadd / vfma), so the order of the math is the one stated at each kernel. */
#include "vec.h"

/* ---- linear: rows of activations by a packed constant weight -----------------------------------
 *
 *   Y[m, n] = act(sum_k A[m, k] W[n, k] + bias[n]) + R[m, n]          m in [m0, m1), n < N
 *
 * A (M, K) row-major, rows `lda` apart, read in place; or, with a layer norm (`lnw`, `lnb`
 * given), A's rows normalized first (rows.c's ember_layer_norm, the same bits) into `scratch`, a
 * block of LR rows at a time. W is the linear's (N, K) weight, packed once by ember_linear_pack:
 * panels of LNR columns, k-major, columns past N zero. The bias, the activation (vec.h's codes
 * 0-6, GELU included) and the residual R (M, N), rows `ldr` apart, are each optional. Y may be R
 * (the sum in place), never A.
 *
 * Blocks of LR rows by LNR columns (two vectors: 16 accumulators; AVX-512: 8 x 32), k the loop
 * inside: per k two loads of the panel and LR broadcasts of A, 2 LR multiply-adds. Measured on
 * this file's first machine (one core, hot caches): 256 x 128 x 384 in 133 us, 95 G multiply-adds
 * a second, ~80% of the core's FMA peak; OpenBLAS took 150-235 us on two threads.
 *
 * Order of the float32 math, per output: acc = 0, acc += A[m, k] W[n, k] for k ascending (fused
 * multiply-adds where the CPU has them), then + bias[n], then the activation, then R[m, n] + that.
 * An output does not depend on the rows a call is given: the same bits on any number of threads. */
/* the float32 lanes of this build's vectors (vec.h's VW: 16 with AVX-512, 8 with AVX, else 4) */
EXPORT i64 ember_vector_width(void) { return VW; }

#if VW == 16
#define LR 8
#else
#define LR 4          /* (16 vector registers: 8 accumulators) */
#endif
#define LNR (2 * VW)

enum { L_M, L_K, L_N, L_LDA, L_LDY, L_LDR, L_ACT, L_LEN };

/* Pack the (N, K) weight `w` (rows `ldw` apart) into `bp`: returns the floats the packed weight
 * needs, and writes it only when `len` is at least that. -1 for a bad size. */
EXPORT i64 ember_linear_pack(const f32 *w, i64 N, i64 K, i64 ldw, f32 *bp, i64 len) {
  if (N <= 0 || K <= 0 || ldw < K) return -1;
  const i64 panels = (N + LNR - 1) / LNR, need = panels * K * LNR;
  if (len < need) return need;
  for (i64 p = 0; p < panels; p++)
    for (i64 k = 0; k < K; k++) {
      f32 *d = bp + (p * K + k) * LNR;
      for (i64 j = 0; j < LNR; j++) {
        const i64 n = p * LNR + j;
        d[j] = n < N ? w[n * ldw + k] : 0.0f;
      }
    }
  return need;
}

/* floats of `scratch` an ember_linear call with a layer norm needs (K of LR rows) */
EXPORT i64 ember_linear_scratch(i64 K) { return K * LR; }

/* The epilogue of a block (its sums in `t`, LR rows of LNR): rows [0, rows), columns [0, cols) of
 * y. (The sums go through `t` so that the epilogue's constants, GELU's, never compete with the
 * accumulators for registers.) */
INLINE void lin_epilogue(const f32 *t, const f32 *bias, const f32 *res, i64 ldr, f32 *y,
                                                   i64 ldy, int rows, i64 cols, int act, const f32 *ap) {
  const i64 n0 = cols < VW ? cols : VW, n1 = cols - n0;
  vf b0 = {0}, b1 = {0};
  if (bias) {
    b0 = load_n(bias, n0);
    if (n1) b1 = load_n(bias + VW, n1);
  }
#define LIN_EPI(ACT)                                                                            \
  for (int r = 0; r < rows; r++) {                                                              \
    vf v0 = load(t + r * LNR), v1 = load(t + r * LNR + VW);                                     \
    if (bias) v0 = v0 + b0, v1 = v1 + b1;                                                        \
    v0 = finish(v0, 0, 0.0f, ACT, ap);                                                          \
    if (n1) v1 = finish(v1, 0, 0.0f, ACT, ap);                                                  \
    if (res) {                                                                                  \
      v0 = load_n(res + r * ldr, n0) + v0;                                                      \
      if (n1) v1 = load_n(res + r * ldr + VW, n1) + v1;                                         \
    }                                                                                           \
    store_n(y + r * ldy, v0, n0);                                                               \
    if (n1) store_n(y + r * ldy + VW, v1, n1);                                                  \
  }
  FINISH_ACTS(LIN_EPI)
#undef LIN_EPI
}

/* One block: rows `a[0..LR)` (pointers: rows past `rows` repeat the last one, never stored), the
 * panel `w` (K x LNR); the sums go to `t` (LR rows of LNR). */
INLINE void lin_block(const f32 *const *a, const f32 *w, i64 K, f32 *t) {
  vf acc[LR][2];
  for (int r = 0; r < LR; r++) acc[r][0] = acc[r][1] = (vf){0};
  for (i64 k = 0; k < K; k++) {
    const vf w0 = load(w + k * LNR), w1 = load(w + k * LNR + VW);
    for (int r = 0; r < LR; r++) {
      const vf s = splat(a[r][k]);
      acc[r][0] = vmadd(s, w0, acc[r][0]);
      acc[r][1] = vmadd(s, w1, acc[r][1]);
    }
  }
  for (int r = 0; r < LR; r++) {
    store(t + r * LNR, acc[r][0]);
    store(t + r * LNR + VW, acc[r][1]);
  }
}

/* Rows [m0, m1) of Y (see above). geom: [0] M [1] K [2] N [3] lda [4] ldy [5] ldr [6] activation;
 * ap: [a, b, lo, hi] (the activation's), [4] the layer norm's eps. Returns 0; or, with nothing
 * written, -1 for a geometry it does not take, or the scratch length needed (a layer norm with
 * scratch_len below K * LR). */
EXPORT i64 ember_linear(const f32 *a, const f32 *lnw, const f32 *lnb, const f32 *wp, const f32 *bias,
                        const f32 *res, f32 *y, const i64 *g, const f32 *ap, f32 *scratch, i64 scratch_len,
                        i64 m0, i64 m1) {
  const i64 M = g[L_M], K = g[L_K], N = g[L_N], lda = g[L_LDA], ldy = g[L_LDY], ldr = g[L_LDR], act = g[L_ACT];
  if (M <= 0 || K <= 0 || N <= 0 || lda < K || ldy < N || (res && ldr < N) || act < 0 || act >= ACT_COUNT ||
      m0 < 0 || m1 > M || m0 > m1 || (lnw != NULL) != (lnb != NULL))
    return -1;
  if (lnw && scratch_len < K * LR) return K * LR;
  const i64 panels = (N + LNR - 1) / LNR;
  for (i64 m = m0; m < m1; m += LR) {
    const int rows = (int)(m1 - m < LR ? m1 - m : LR);
    const f32 *ar[LR];
    if (lnw) {
      ember_layer_norm_rows(rows, K, a + m * lda, lda, lnw, lnb, ap[4], scratch, K);
      for (int r = 0; r < LR; r++) ar[r] = scratch + (r < rows ? r : rows - 1) * K;
    } else {
      for (int r = 0; r < LR; r++) ar[r] = a + (m + (r < rows ? r : rows - 1)) * lda;
    }
    for (i64 p = 0; p < panels; p++) {
      const i64 n = p * LNR, cols = N - n < LNR ? N - n : LNR;
      const f32 *b = bias ? bias + n : NULL, *rr = res ? res + m * ldr + n : NULL;
      f32 *yb = y + m * ldy + n;
      f32 t[LR * LNR] __attribute__((aligned(64)));
      lin_block(ar, wp + p * K * LNR, K, t);
      lin_epilogue(t, b, rr, ldr, yb, ldy, rows, cols, (int)act, ap);
    }
  }
  return 0;
}

/* ---- attention: softmax(c q k^T) v over (batch, head) units -------------------------------------
 *
 *   y[b, h, t, :] = sum_s p[t, s] v[b, h, s, :],   p[t, :] = softmax over s of c (q[b, h, t, :] . k[b, h, s, :])
 *
 * for units u = b H + h in [u0, u1). q (B, H, T, D), k (B, H, S, D), v (B, H, S, E) and y (B, H, T,
 * E) in any element strides: the heads of a fused qkv projection are read where they lie (no
 * permuted copies), and y is written in the layout the next step reads ((B, T, H, E): the heads
 * merged back). Per unit, k^T (D x S) and v (S x E) are copied into `scratch`, their rows padded to
 * whole blocks of 2 VW columns; then blocks of LR query rows: the scores (the product above, LR x S),
 * times c, rows.c's softmax per row, then the product by v.
 *
 * Order of the float32 math: score = sum over d ascending of q k (fused multiply-adds where the CPU
 * has them), then score * c (with a scale: the plan's multiply step), the softmax as rows.c's
 * ember_softmax, then y = sum over s ascending of p v. Units are independent: the same bits on any
 * number of threads. */
enum { A_B, A_H, A_T, A_S, A_D, A_E, A_Q, A_K = A_Q + 4, A_V = A_K + 4, A_Y = A_V + 4, A_SCALE = A_Y + 4, A_LEN };

/* c (rows <= LR rows of 2 VW, ldc apart) = sum_k a[r * ars + k * aks] b[k * ldb + j]: b's rows
 * hold whole blocks of 2 VW floats */
INLINE void tile(const f32 *a, i64 ars, i64 aks, const f32 *b, i64 ldb, i64 K, int rows, f32 *c, i64 ldc) {
  vf acc[LR][2];
  const f32 *ar[LR];
  for (int r = 0; r < LR; r++) {
    acc[r][0] = acc[r][1] = (vf){0};
    ar[r] = a + (r < rows ? r : rows - 1) * ars;
  }
  for (i64 k = 0; k < K; k++) {
    const vf w0 = load(b + k * ldb), w1 = load(b + k * ldb + VW);
    const i64 ka = k * aks;
    for (int r = 0; r < LR; r++) {
      const vf s = splat(ar[r][ka]);
      acc[r][0] = vmadd(s, w0, acc[r][0]);
      acc[r][1] = vmadd(s, w1, acc[r][1]);
    }
  }
  for (int r = 0; r < rows; r++) {
    store(c + r * ldc, acc[r][0]);
    store(c + r * ldc + VW, acc[r][1]);
  }
}

/* floats of scratch an ember_attention call needs for S keys, head size D and value size E */
INLINE i64 attention_scratch(i64 S, i64 D, i64 E) {
  const i64 Sp = (S + LNR - 1) / LNR * LNR, Ep = (E + LNR - 1) / LNR * LNR;
  return D * Sp + S * Ep + 2 * LR * Sp + LR * LNR;
}

/* Units [u0, u1) (see above). geom: [0] B [1] H [2] T [3] S [4] D [5] E, [6..9] q's element strides
 * (B, H, T, D), [10..13] k's (B, H, S, D), [14..17] v's (B, H, S, E), [18..21] y's (B, H, T, E), [22]
 * 1 to multiply the scores by c; scratch: scratch_len floats of this call's own. Returns 0; or,
 * with nothing written, the scratch length needed when scratch_len is smaller, or -1 for a
 * geometry it does not take. */
EXPORT i64 ember_attention(const f32 *q, const f32 *k, const f32 *v, f32 *y, const i64 *g, f32 c, f32 *scratch,
                           i64 scratch_len, i64 u0, i64 u1) {
  const i64 B = g[A_B], H = g[A_H], T = g[A_T], S = g[A_S], D = g[A_D], E = g[A_E];
  if (B <= 0 || H <= 0 || T <= 0 || S <= 0 || D <= 0 || E <= 0 || u0 < 0 || u1 > B * H || u0 > u1) return -1;
  const i64 need = attention_scratch(S, D, E);
  if (scratch_len < need) return need;
  const i64 Sp = (S + LNR - 1) / LNR * LNR, Ep = (E + LNR - 1) / LNR * LNR;
  const i64 *qs = g + A_Q, *ks = g + A_K, *vs = g + A_V, *ys = g + A_Y;
  f32 *kt = scratch, *vp = kt + D * Sp, *sc = vp + S * Ep, *pr = sc + LR * Sp, *ct = pr + LR * Sp;
  for (i64 u = u0; u < u1; u++) {
    const i64 b = u / H, h = u % H;
    const f32 *qb = q + b * qs[0] + h * qs[1], *kb = k + b * ks[0] + h * ks[1], *vb = v + b * vs[0] + h * vs[1];
    f32 *yb = y + b * ys[0] + h * ys[1];
    for (i64 s = 0; s < S; s++) {               /* (k's rows read along d, written down kt's columns) */
      const f32 *kr = kb + s * ks[2];
      for (i64 d = 0; d < D; d++) kt[d * Sp + s] = kr[d * ks[3]];
    }
    for (i64 d = 0; d < D; d++)
      for (i64 s = S; s < Sp; s++) kt[d * Sp + s] = 0.0f;
    for (i64 s = 0; s < S; s++) {
      f32 *row = vp + s * Ep;
      if (vs[3] == 1)
        memcpy(row, vb + s * vs[2], (size_t)E * 4);
      else
        for (i64 e = 0; e < E; e++) row[e] = vb[s * vs[2] + e * vs[3]];
      for (i64 e = E; e < Ep; e++) row[e] = 0.0f;
    }
    for (i64 t0 = 0; t0 < T; t0 += LR) {
      const int rows = (int)(T - t0 < LR ? T - t0 : LR);
      const f32 *qr = qb + t0 * qs[2];
      for (i64 j = 0; j < Sp; j += LNR) tile(qr, qs[2], qs[3], kt + j, Sp, D, rows, sc + j, Sp);
      if (g[A_SCALE])
        for (int r = 0; r < rows; r++)
          for (i64 j = 0; j < Sp; j += VW) store(sc + r * Sp + j, load(sc + r * Sp + j) * c);
      ember_softmax_rows(rows, S, sc, Sp, pr, Sp);
      for (i64 e0 = 0; e0 < Ep; e0 += LNR) {
        tile(pr, Sp, 1, vp + e0, Ep, S, rows, ct, LNR);
        const i64 ne = E - e0 < LNR ? E - e0 : LNR;
        for (int r = 0; r < rows; r++) {
          f32 *yr = yb + (t0 + r) * ys[2] + e0 * ys[3];
          const f32 *cr = ct + r * LNR;
          if (ys[3] == 1) {
            store_n(yr, load(cr), ne < VW ? ne : VW);
            if (ne > VW) store_n(yr + VW, load(cr + VW), ne - VW);
          } else {
            for (i64 e = 0; e < ne; e++) yr[e * ys[3]] = cr[e];
          }
        }
      }
    }
  }
  return 0;
}

/* ---- squeeze-excite: x * gate(the means of x's planes) ----------------------------------------
 *
 *   z = act1(W1 m + b1),  s = act2(W2 z + b2),  y[n, c, :] = x[n, c, :] * s[c]
 *
 * MobileNetV3's squeeze-excite after its global average pool m (the plan computes the means with
 * its own steps: their bits): the two 1x1 convolutions at one pixel with relu and hard sigmoid
 * and the product with the input, where the plan ran four steps. x and y (N, C, P) C-contiguous,
 * y may be x (in place); m (N, C); W1 (C1, C) and W2 (C, C1) row-major, b1, b2 or NULL;
 * activations of vec.h's codes 0-4.
 *
 * Order of the float32 math: the two matrix-vector products are dense.c's ember_gemv (the bits of
 * the plan's one-pixel convolutions), then x * s, numpy's float32 product. */
enum { E_N, E_C, E_P, E_C1, E_ACT1, E_ACT2, E_LEN };

/* Images [0, N) (see above). geom: [0] N [1] C [2] P (plane size) [3] C1 [4] act1 [5] act2; ap: [0..3]
 * act1's (a, b, lo, hi), [4..7] act2's; scratch: C1 + C floats. Returns 0; or, with nothing
 * written, the scratch length needed when scratch_len is smaller, or -1 for a geometry it does
 * not take. */
EXPORT i64 ember_squeeze_excite(const f32 *x, f32 *y, const f32 *m, const f32 *w1, const f32 *b1, const f32 *w2,
                                const f32 *b2, const i64 *g, const f32 *ap, f32 *scratch, i64 scratch_len) {
  const i64 N = g[E_N], C = g[E_C], Pn = g[E_P], C1 = g[E_C1], act1 = g[E_ACT1], act2 = g[E_ACT2];
  if (N <= 0 || C <= 0 || Pn <= 0 || C1 <= 0 || act1 < 0 || act1 > ACT_HARD_SWISH || act2 < 0 ||
      act2 > ACT_HARD_SWISH)
    return -1;
  if (scratch_len < C + C1) return C + C1;
  f32 *z = scratch, *s = z + C1;
  i64 g1[6] = {C1, C, 1, C, C1, act1}, g2[6] = {C, C1, 1, C1, C, act2};
  const i64 pv = Pn / VW * VW;
  for (i64 n = 0; n < N; n++) {
    if (ember_gemv(w1, m + n * C, b1, z, g1, ap, 0, C1) || ember_gemv(w2, z, b2, s, g2, ap + 4, 0, C)) return -1;
    for (i64 c = 0; c < C; c++) {
      const f32 *xc = x + (n * C + c) * Pn;
      f32 *yc = y + (n * C + c) * Pn;
      const vf sc = splat(s[c]);
      i64 i = 0;
      for (; i < pv; i += VW) store(yc + i, load(xc + i) * sc);
      if (i < Pn) store_part(yc + i, load_part(xc + i, Pn - i) * sc, Pn - i);
    }
  }
  return 0;
}
