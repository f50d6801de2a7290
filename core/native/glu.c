/* silu(g) * u in one pass: a SwiGLU feed-forward's gate and up halves (numpy_plan fuses the silu
 * step with the multiply that alone reads it: a decode step of SmolLM2 made both, 30 layers of
 * 1536 floats, ~28 us of numpy passes and Python each).
 *
 * y[r, i] = g[r, i] / (1 + e^(-g[r, i])) * u[r, i] for rows r < rows, i < n; g, u and y rows
 * ldg, ldu, ldy floats apart. Float32 math: vec.h's vexp (within ~1 ulp), the division, then the
 * product: within a few float32 roundings of numpy's silu (its exp, e / (1 + e) for negative g)
 * then multiply (g below about -88: -0 * u where numpy gets a denormal times u); g = -inf and NaN
 * give NaN, as numpy. */
#include "vec.h"

EXPORT i64 ember_silu_mul(const f32 *g, const f32 *u, f32 *y, i64 rows, i64 n, i64 ldg, i64 ldu, i64 ldy) {
  for (i64 r = 0; r < rows; r++) {
    const f32 *gr = g + r * ldg, *ur = u + r * ldu;
    f32 *yr = y + r * ldy;
    for (i64 i = 0; i < n; i += VW) {
      const i64 w = n - i < VW ? n - i : VW;
      const vf x = load_n(gr + i, w);
      vf s = x / (1.0f + vexp(-x));
      NO_CONTRACT(s);
      store_n(yr + i, s * load_n(ur + i, w), w);
    }
  }
  return 0;
}
