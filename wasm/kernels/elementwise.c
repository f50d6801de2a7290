/* Elementwise float32 kernels. Placeholder set while the full family is written. */
#include "ember.h"

EXPORT(relu_f32) void relu_f32(const f32 *x, f32 *y, i32 n) {
  i32 i = 0;
  const f32x4 z = wasm_f32x4_splat(0.f);
  for (; i + 4 <= n; i += 4) wasm_v128_store(y + i, wasm_f32x4_pmax(z, wasm_v128_load(x + i)));
  for (; i < n; i++) y[i] = x[i] > 0.f ? x[i] : 0.f;   /* NaN stays NaN, like max(x, 0) in numpy? see note */
}
