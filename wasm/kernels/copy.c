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
