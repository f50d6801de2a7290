/* 2-D max and average pooling in float32 over nc planes of h x w (NCHW with N and C merged).
 * Attributes arrive as one int32 table (POOL_* below, mirrored in ops_linalg.py). The output
 * size (ceil_mode included) is Python's; a window that runs past the input reads nothing there.
 *  - max: NaN anywhere in the window gives NaN; taps in the padding never win; a window with no
 *    tap inside the input (possible with dilation) gives -inf. 2x2 windows at stride 2 without
 *    padding run four outputs at a time.
 *  - avg: the sum of the taps inside the input, divided by PyTorch's count: the window clipped to
 *    the padded input (count_include_pad) or to the input itself. */
#include "ember.h"
#include "linalg.h"

enum { POOL_NC, POOL_H, POOL_W, POOL_KH, POOL_KW, POOL_SH, POOL_SW, POOL_PT, POOL_PL, POOL_PB, POOL_PR,
       POOL_DH, POOL_DW, POOL_OH, POOL_OW, POOL_INCLUDE_PAD };

INLINE f32 nanmax(f32 m, f32 v) { return (v > m || v != v) ? v : m; }

/* (a separate function: written inline, clang turned these four compares into a vector compare
 * with a dead stack slot, which the module may not have) */
static __attribute__((noinline)) i32 is_2x2(i32 kh, i32 kw, i32 sh, i32 sw) {
  return kh == 2 && kw == 2 && sh == 2 && sw == 2;
}

static void max2x2(const f32 *x, f32 *y, i32 h, i32 w, i32 oh, i32 ow) {
  for (i32 oy = 0; oy < oh; oy++) {
    const f32 *r0 = x + 2 * oy * w, *r1 = r0 + w;
    f32 *out = y + oy * ow;
    i32 ox = 0;
    for (; 2 * ox + 8 <= w && ox + 4 <= ow; ox += 4) {
      const f32x4 m0 = wasm_f32x4_max(wasm_v128_load(r0 + 2 * ox), wasm_v128_load(r1 + 2 * ox));
      const f32x4 m1 = wasm_f32x4_max(wasm_v128_load(r0 + 2 * ox + 4), wasm_v128_load(r1 + 2 * ox + 4));
      wasm_v128_store(out + ox, wasm_f32x4_max(wasm_i32x4_shuffle(m0, m1, 0, 2, 4, 6),
                                               wasm_i32x4_shuffle(m0, m1, 1, 3, 5, 7)));
    }
    if (ox < ow && ow >= 4 && 2 * ow <= w) {
      /* the last 1-3 outputs: one more vector over the row's last four (recomputing some) */
      const i32 o4 = ow - 4;
      const f32x4 m0 = wasm_f32x4_max(wasm_v128_load(r0 + 2 * o4), wasm_v128_load(r1 + 2 * o4));
      const f32x4 m1 = wasm_f32x4_max(wasm_v128_load(r0 + 2 * o4 + 4), wasm_v128_load(r1 + 2 * o4 + 4));
      wasm_v128_store(out + o4, wasm_f32x4_max(wasm_i32x4_shuffle(m0, m1, 0, 2, 4, 6),
                                               wasm_i32x4_shuffle(m0, m1, 1, 3, 5, 7)));
      ox = ow;
    }
    for (; ox < ow; ox++) {
      const f32 *a = r0 + 2 * ox, *b = r1 + 2 * ox;
      out[ox] = nanmax(nanmax(nanmax(a[0], a[1]), b[0]), b[1]);
    }
  }
}

EXPORT(max_pool2d_f32) void max_pool2d_f32(const f32 *x, f32 *y, const i32 *prm) {
  const i32 nc = prm[POOL_NC], h = prm[POOL_H], w = prm[POOL_W], kh = prm[POOL_KH], kw = prm[POOL_KW];
  const i32 sh = prm[POOL_SH], sw = prm[POOL_SW], pt = prm[POOL_PT], pl = prm[POOL_PL];
  const i32 dh = prm[POOL_DH], dw = prm[POOL_DW], oh = prm[POOL_OH], ow = prm[POOL_OW];
  const i32 fast = is_2x2(kh, kw, sh, sw) && pt == 0 && pl == 0 && dh == 1 && dw == 1 && 2 * oh <= h && 2 * ow <= w;
  for (i32 p = 0; p < nc; p++) {
    const f32 *plane = x + p * h * w;
    f32 *out = y + p * oh * ow;
    if (fast) {
      max2x2(plane, out, h, w, oh, ow);
      continue;
    }
    for (i32 oy = 0; oy < oh; oy++)
      for (i32 ox = 0; ox < ow; ox++) {
        f32 m = -__builtin_inff();
        for (i32 ky = 0; ky < kh; ky++) {
          const i32 iy = oy * sh - pt + ky * dh;
          if (iy < 0 || iy >= h) continue;
          const f32 *row = plane + iy * w;
          for (i32 kx = 0; kx < kw; kx++) {
            const i32 ix = ox * sw - pl + kx * dw;
            if (ix >= 0 && ix < w) m = nanmax(m, row[ix]);
          }
        }
        *out++ = m;
      }
  }
}

EXPORT(avg_pool2d_f32) void avg_pool2d_f32(const f32 *x, f32 *y, const i32 *prm) {
  const i32 nc = prm[POOL_NC], h = prm[POOL_H], w = prm[POOL_W], kh = prm[POOL_KH], kw = prm[POOL_KW];
  const i32 sh = prm[POOL_SH], sw = prm[POOL_SW], pt = prm[POOL_PT], pl = prm[POOL_PL];
  const i32 pb = prm[POOL_PB], pr = prm[POOL_PR], oh = prm[POOL_OH], ow = prm[POOL_OW];
  const i32 include = prm[POOL_INCLUDE_PAD];
  for (i32 p = 0; p < nc; p++) {
    const f32 *plane = x + p * h * w;
    f32 *out = y + p * oh * ow;
    for (i32 oy = 0; oy < oh; oy++) {
      const i32 y0 = oy * sh - pt, y1 = y0 + kh;
      const i32 ya = y0 < 0 ? 0 : y0, yb = y1 < h ? y1 : h;
      const i32 ny = include ? (y1 < h + pb ? y1 : h + pb) - y0 : yb - ya;
      for (i32 ox = 0; ox < ow; ox++) {
        const i32 x0 = ox * sw - pl, x1 = x0 + kw;
        const i32 xa = x0 < 0 ? 0 : x0, xb = x1 < w ? x1 : w;
        const i32 nx = include ? (x1 < w + pr ? x1 : w + pr) - x0 : xb - xa;
        f32 s = 0.f;
        for (i32 iy = ya; iy < yb; iy++)
          for (i32 ix = xa; ix < xb; ix++) s += plane[iy * w + ix];
        *out++ = s / (f32)(ny * nx);
      }
    }
  }
}
