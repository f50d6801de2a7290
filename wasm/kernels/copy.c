/* Layout kernels: a row-major copy of a strided view (permute, broadcast, slice, flip, concat
 * pieces) for 1-, 4- and 8-byte elements. `sh`/`st`: 6 int32 each (shape and source strides in
 * elements, left-padded with size-1 axes by Python); strides may be 0 (broadcast) or negative
 * (flip). `src` points at the view's first element. */
#include "ember.h"
#include "team.h"

/* NAME_rows: output rows [r0, r1) of the copy, a row being the innermost axis's sh[5] elements
 * and rows numbered in row-major order of the first five axes (the team's share, team.h: every
 * element is copied by the same loop as in one call). */
#define STRIDED_COPY(NAME, T)                                                                 \
  void NAME##_rows(const T *src, T *dst, const i32 *sh, const i32 *st, i32 r0, i32 r1) {    \
    const i32 n5 = sh[5], s5 = st[5];                                                         \
    i32 r = r0, e = r % sh[4], d, c, b, a;                                                    \
    r /= sh[4], d = r % sh[3], r /= sh[3], c = r % sh[2], r /= sh[2], b = r % sh[1], a = r / sh[1]; \
    dst += (i64)r0 * n5;                                                                      \
    for (i32 k = r0; k < r1; k++) {                                                           \
      const T *s = src + a * st[0] + b * st[1] + c * st[2] + d * st[3] + e * st[4];           \
      if (s5 == 1) { for (i32 i = 0; i < n5; i++) dst[i] = s[i]; }                            \
      else if (s5 == 0) { const T v = s[0]; for (i32 i = 0; i < n5; i++) dst[i] = v; }        \
      else { for (i32 i = 0; i < n5; i++) dst[i] = s[i * s5]; }                               \
      dst += n5;                                                                              \
      if (++e == sh[4]) {                                                                     \
        e = 0;                                                                                \
        if (++d == sh[3]) {                                                                   \
          d = 0;                                                                              \
          if (++c == sh[2]) {                                                                 \
            c = 0;                                                                            \
            if (++b == sh[1]) b = 0, a++;                                                     \
          }                                                                                   \
        }                                                                                     \
      }                                                                                       \
    }                                                                                         \
  }                                                                                           \
  EXPORT(NAME) void NAME(const T *src, T *dst, const i32 *sh, const i32 *st) {              \
    NAME##_rows(src, dst, sh, st, 0, copy_rows(sh));                                          \
  }

STRIDED_COPY(copy_strided_x8, unsigned char)
STRIDED_COPY(copy_strided_x32, u32)
STRIDED_COPY(copy_strided_x64, i64)

/* How many of the team's nt threads share a strided copy of `size`-byte elements (team.h): 1
 * when its source and destination spans overlap (one thread's order then decides what is read,
 * as in one call) or the copy is small. */
i32 copy_width(const void *src, const void *dst, const i32 *sh, const i32 *st, i32 size, const i32 *ctl, i32 nt) {
  const i32 rows = copy_rows(sh);
  if (!ctl || nt <= 1 || rows < 2) return 1;
  i64 lo = 0, hi = 0;   /* the source's reach, in elements from src */
  for (i32 k = 0; k < 6; k++) {
    const i64 m = (i64)(sh[k] - 1) * st[k];
    if (m > 0) hi += m;
    else lo += m;
  }
  const i64 s0 = (i64)(u32)(__UINTPTR_TYPE__)src + lo * size, s1 = (i64)(u32)(__UINTPTR_TYPE__)src + (hi + 1) * size;
  const i64 d0 = (i64)(u32)(__UINTPTR_TYPE__)dst, d1 = d0 + (i64)rows * sh[5] * size;
  if (s0 < d1 && d0 < s1) return 1;
  const i32 w = team_width(ctl, nt, (i64)rows * sh[5] * 2);
  return w < rows ? w : rows;
}

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
