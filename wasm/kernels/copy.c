/* Layout kernels: a row-major copy of a strided view (permute, broadcast, slice, flip, concat
 * pieces) for 1-, 4- and 8-byte elements. `sh`/`st`: 6 int32 each (shape and source strides in
 * elements, left-padded with size-1 axes by Python); strides may be 0 (broadcast) or negative
 * (flip). `src` points at the view's first element. */
#include "ember.h"

#define STRIDED_COPY(NAME, T)                                                                 \
  EXPORT(NAME) void NAME(const T *src, T *dst, const i32 *sh, const i32 *st) {              \
    const i32 n5 = sh[5], s5 = st[5];                                                         \
    for (i32 a = 0; a < sh[0]; a++)                                                           \
      for (i32 b = 0; b < sh[1]; b++)                                                         \
        for (i32 c = 0; c < sh[2]; c++)                                                       \
          for (i32 d = 0; d < sh[3]; d++)                                                     \
            for (i32 e = 0; e < sh[4]; e++) {                                                 \
              const T *s = src + a * st[0] + b * st[1] + c * st[2] + d * st[3] + e * st[4];   \
              if (s5 == 1) { for (i32 i = 0; i < n5; i++) dst[i] = s[i]; }                    \
              else if (s5 == 0) { const T v = s[0]; for (i32 i = 0; i < n5; i++) dst[i] = v; } \
              else { for (i32 i = 0; i < n5; i++) dst[i] = s[i * s5]; }                       \
              dst += n5;                                                                      \
            }                                                                                 \
  }

STRIDED_COPY(copy_strided_x8, unsigned char)
STRIDED_COPY(copy_strided_x32, u32)
STRIDED_COPY(copy_strided_x64, i64)

/* take along an axis (an embedding row, a RoPE table row at a position): `src` viewed as
 * (outer, n, inner) elements, `m` int32 indices (negative ones count from the end, as numpy's
 * take), `dst` gets (outer, m, inner). Every index is checked before anything is read or
 * written: returns 0 when all lie in -n..n-1, else 1 + the position of the first that does not
 * (dst untouched). The result is an i32, so in a replayed command table this is a guarded
 * command: an index out of range stops the table and Python raises the typed error. */
#define TAKE(NAME, T)                                                                         \
  EXPORT(NAME) i32 NAME(const T *src, const i32 *idx, T *dst, i32 outer, i32 n, i32 inner,  \
                        i32 m) {                                                              \
    for (i32 j = 0; j < m; j++)                                                               \
      if (idx[j] < -n || idx[j] >= n) return j + 1;                                           \
    for (i32 o = 0; o < outer; o++, src += n * inner)                                         \
      for (i32 j = 0; j < m; j++) {                                                           \
        const i32 i = idx[j] < 0 ? idx[j] + n : idx[j];                                       \
        const T *s = src + i * inner;                                                         \
        for (i32 k = 0; k < inner; k++) dst[k] = s[k];                                        \
        dst += inner;                                                                         \
      }                                                                                       \
    return 0;                                                                                 \
  }

TAKE(take_x8, unsigned char)
TAKE(take_x32, u32)
TAKE(take_x64, i64)
