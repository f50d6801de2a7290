/* A residual add and the rms_norm that reads it, in one call (numpy_plan fuses a float32 add
 * with the rms_norm step after it: a decoder layer's `x = x + o; h = rms_norm(x, w)`, twice a
 * layer; each step cost a replayed op, ~8 us (add) and ~14 us (rms_norm) in SmolLM2's decode).
 *
 * s = a + b (float32, as numpy's add), then y = s / sqrt(mean(s^2) + eps) * w in float64 from the
 * float32 s, rounded once: the same operations in the same order as wasm/kernels/llm.c's
 * rms_norm_f32 (the sum of squares in two pairs of float64 lanes over blocks of four, then the
 * lanes, then the tail; inv = 1 / sqrt(ss / n + eps); y = s * inv * w), so the same bits as the
 * two steps (numpy_llm's native rms_norm). Rows of n, contiguous. */
#include "ember_native.h"
#include <math.h>

typedef double f64;

EXPORT i64 ember_add_rms_norm(const f32 *a, const f32 *b, const f32 *w, f32 *s, f32 *y, i64 rows, i64 n,
                              double eps) {
  for (i64 r = 0; r < rows; r++) {
    const f32 *ar = a + r * n, *br = b + r * n;
    f32 *sr = s + r * n, *yr = y + r * n;
    for (i64 i = 0; i < n; i++) sr[i] = ar[i] + br[i];
    f64 p0 = 0.0, p1 = 0.0, q0 = 0.0, q1 = 0.0;     /* (llm.c's a0 lanes 0, 1 and a1 lanes 0, 1) */
    i64 i = 0;
    for (; i + 4 <= n; i += 4) {
      const f64 x0 = sr[i], x1 = sr[i + 1], x2 = sr[i + 2], x3 = sr[i + 3];
      const f64 m0 = x0 * x0, m1 = x1 * x1, m2 = x2 * x2, m3 = x3 * x3;   /* (products apart from the
                                                                            adds: no contraction) */
      p0 = p0 + m0, p1 = p1 + m1, q0 = q0 + m2, q1 = q1 + m3;
    }
    f64 ss = (p0 + q0) + (p1 + q1);
    for (; i < n; i++) {
      const f64 m = (f64)sr[i] * (f64)sr[i];
      ss += m;
    }
    const f64 inv = 1.0 / sqrt(ss / (f64)n + eps);
    for (i = 0; i < n; i++) yr[i] = (f32)((f64)sr[i] * inv * (f64)w[i]);
  }
  return 0;
}
