/* dtype conversions (the `cast` op) between float32, int32, int64, uint8 and bool, with the
 * python backend's semantics: float -> int truncates toward zero and saturates at the int range,
 * NaN -> 0 (WebAssembly's trunc_sat does exactly that); int -> int wraps (two's complement);
 * anything -> bool is `!= 0` (NaN is true); float -> uint8 saturates to 0..255. Codes:
 * 0 float32, 1 int32, 2 int64, 3 uint8, 4 bool. */
#include "ember.h"

typedef unsigned char u8;

#define LOOP(DST_T, SRC_T, EXPR)                                       \
  {                                                                    \
    const SRC_T *s = (const SRC_T *)src;                               \
    DST_T *d = (DST_T *)dst;                                           \
    for (i32 i = 0; i < n; i++) { const SRC_T v = s[i]; d[i] = EXPR; } \
    return 1;                                                          \
  }

INLINE u8 f32_to_u8(f32 v) {
  if (!(v > 0.f)) return 0;          /* NaN and negatives */
  if (v >= 255.f) return 255;
  return (u8)__builtin_wasm_trunc_saturate_u_i32_f32(v);
}

/* Returns 1 when the pair is handled, 0 otherwise (Python then uses its own kernel). */
EXPORT(cast) i32 cast(const void *src, i32 from, void *dst, i32 to, i32 n) {
  switch (from * 8 + to) {
    case 0 * 8 + 1: {   /* float32 -> int32: SIMD trunc_sat */
      const f32 *s = (const f32 *)src;
      i32 *d = (i32 *)dst;
      i32 i = 0;
      for (; i + 4 <= n; i += 4) wasm_v128_store(d + i, wasm_i32x4_trunc_sat_f32x4(wasm_v128_load(s + i)));
      for (; i < n; i++) d[i] = __builtin_wasm_trunc_saturate_s_i32_f32(s[i]);
      return 1;
    }
    case 0 * 8 + 2: LOOP(i64, f32, __builtin_wasm_trunc_saturate_s_i64_f32(v))
    case 0 * 8 + 3: LOOP(u8, f32, f32_to_u8(v))
    case 0 * 8 + 4: LOOP(u8, f32, (u8)(v != 0.f))
    case 1 * 8 + 0: {   /* int32 -> float32: SIMD convert */
      const i32 *s = (const i32 *)src;
      f32 *d = (f32 *)dst;
      i32 i = 0;
      for (; i + 4 <= n; i += 4) wasm_v128_store(d + i, wasm_f32x4_convert_i32x4(wasm_v128_load(s + i)));
      for (; i < n; i++) d[i] = (f32)s[i];
      return 1;
    }
    case 1 * 8 + 2: LOOP(i64, i32, (i64)v)
    case 1 * 8 + 3: LOOP(u8, i32, (u8)(u32)v)
    case 1 * 8 + 4: LOOP(u8, i32, (u8)(v != 0))
    case 2 * 8 + 0: LOOP(f32, i64, (f32)v)
    case 2 * 8 + 1: LOOP(i32, i64, (i32)(u32)(unsigned long long)v)
    case 2 * 8 + 3: LOOP(u8, i64, (u8)(unsigned long long)v)
    case 2 * 8 + 4: LOOP(u8, i64, (u8)(v != 0))
    case 3 * 8 + 0: case 4 * 8 + 0: LOOP(f32, u8, (f32)v)
    case 3 * 8 + 1: case 4 * 8 + 1: LOOP(i32, u8, (i32)v)
    case 3 * 8 + 2: case 4 * 8 + 2: LOOP(i64, u8, (i64)v)
    case 3 * 8 + 4: LOOP(u8, u8, (u8)(v != 0))
    case 4 * 8 + 3: LOOP(u8, u8, v)
    default: return 0;
  }
}
