/* 2-D convolution in float32 (NCHW input, OIHW weight), two ways:
 *  - conv2d_gemm: per (batch, group), the output channels of the group are one GEMM,
 *    weight rows (og x cg*kh*kw) times image patches; the patches of a chunk of output positions
 *    are written straight into packed panels (im2col) in Python's scratch buffer, so the chunk
 *    stays in cache between being written and being used. A 1x1, stride-1, unpadded convolution
 *    needs no im2col: its chunk is a plain copy (gemm_pack). With column stride 1 the patches
 *    come from a zero-padded copy of the group's planes (pad_planes, after the panels in the
 *    scratch): no bounds tests, whole vectors even where a panel's 8 positions cross into the
 *    next output row (MNIST's 14-wide rows: im2col 23 -> 9 us of a 16->32 3x3 conv's 75).
 *    Bias (and relu, GEMM_RELU) is fused into the GEMM. Where an output row wastes at most 1/8 of
 *    the 8-lane tiles (conv_direct_ok), there is no im2col at all: the 4x8 tile reads the padded
 *    planes directly (conv_tile), same float operations, same bits.
 *  - conv2d_depthwise: one input channel per group (groups == in channels): each output row
 *    accumulates kh*kw shifted, scaled input rows; stride 1 runs four columns at a time.
 * Shapes and attributes arrive as one int32 table (CONV_* indices in linalg.h); Python checked
 * every buffer against them. */
#include "ember.h"
#include "linalg.h"
#include "team.h"

#define ROWS(X) X(0) if (R > 1) X(1) if (R > 2) X(2) if (R > 3) X(3)

/* im2col of positions p0 .. p0 + np - 1 (row-major over oh x ow) of one group's input x (cg planes
 * of h x w) into panels of NR positions: P[q * K * NR + k * NR + lane], k = (ci, ky, kx) as in
 * the weight rows; taps in the padding and lanes past np are zero. */
static void im2col_panels(const f32 *x, f32 *P, i32 cg, i32 h, i32 w, i32 kh, i32 kw, i32 sh, i32 sw,
                          i32 pt, i32 pl, i32 dh, i32 dw, i32 ow, i32 p0, i32 np) {
  const i32 K = cg * kh * kw;
  for (i32 q = 0; q * GEMM_NR < np; q++) {
    f32 *panel = P + q * K * GEMM_NR;
    const i32 first = p0 + q * GEMM_NR, lanes = np - q * GEMM_NR < GEMM_NR ? np - q * GEMM_NR : GEMM_NR;
    const i32 oy = first / ow, ox = first % ow;
    /* Fast case: the panel's 8 positions sit in one output row at stride 1; a tap row then
     * reads 8 consecutive inputs whenever they are all inside the image. */
    if (lanes == GEMM_NR && sw == 1 && ox + GEMM_NR <= ow) {
      for (i32 ci = 0; ci < cg; ci++) {
        const f32 *plane = x + ci * h * w;
        for (i32 ky = 0; ky < kh; ky++) {
          const i32 iy = oy * sh - pt + ky * dh;
          f32 *dst = panel + ((ci * kh + ky) * kw) * GEMM_NR;
          if (iy < 0 || iy >= h) {
            for (i32 kx = 0; kx < kw; kx++, dst += GEMM_NR) {
              wasm_v128_store(dst, wasm_f32x4_splat(0.f));
              wasm_v128_store(dst + 4, wasm_f32x4_splat(0.f));
            }
            continue;
          }
          const f32 *row = plane + iy * w;
          for (i32 kx = 0; kx < kw; kx++, dst += GEMM_NR) {
            const i32 ix = ox - pl + kx * dw;
            if (ix >= 0 && ix + GEMM_NR <= w) {
              wasm_v128_store(dst, wasm_v128_load(row + ix));
              wasm_v128_store(dst + 4, wasm_v128_load(row + ix + 4));
            } else {
              for (i32 l = 0; l < GEMM_NR; l++) {
                const i32 xx = ix + l;
                dst[l] = xx >= 0 && xx < w ? row[xx] : 0.f;
              }
            }
          }
        }
      }
      continue;
    }
    for (i32 l = 0; l < GEMM_NR; l++) {
      f32 *dst = panel + l;
      if (l >= lanes) {
        for (i32 k = 0; k < K; k++) dst[k * GEMM_NR] = 0.f;
        continue;
      }
      const i32 p = first + l, y0 = (p / ow) * sh - pt, x0 = (p % ow) * sw - pl;
      for (i32 ci = 0; ci < cg; ci++) {
        const f32 *plane = x + ci * h * w;
        for (i32 ky = 0; ky < kh; ky++) {
          const i32 iy = y0 + ky * dh;
          const i32 rowok = iy >= 0 && iy < h;
          for (i32 kx = 0; kx < kw; kx++) {
            const i32 ix = x0 + kx * dw;
            *dst = rowok && ix >= 0 && ix < w ? plane[iy * w + ix] : 0.f;
            dst += GEMM_NR;
          }
        }
      }
    }
  }
}

/* The rows and columns of one input plane that a convolution with column stride 1 reads, as a
 * zero-padded copy: hp = (oh - 1) * sh + (kh - 1) * dh + 1 rows of wp = ow + (kw - 1) * dw floats,
 * padded row yy, column xx holding input (yy - pt, xx - pl) or 0. Planes c0 .. c1 - 1 of the
 * group's cg, hp * wp floats apart. */
static void pad_planes(const f32 *x, f32 *pad, i32 h, i32 w, i32 hp, i32 wp, i32 pt, i32 pl, i32 c0, i32 c1) {
  i32 xa = pl < wp ? pl : wp, xb = pl + w < wp ? pl + w : wp;   /* columns [xa, xb) are inside */
  if (xb < xa) xb = xa;
  for (i32 ci = c0; ci < c1; ci++) {
    const f32 *plane = x + ci * h * w;
    f32 *dst = pad + ci * hp * wp;
    for (i32 yy = 0; yy < hp; yy++, dst += wp) {
      const i32 iy = yy - pt;
      if (iy < 0 || iy >= h) {
        for (i32 xx = 0; xx < wp; xx++) dst[xx] = 0.f;
        continue;
      }
      const f32 *row = plane + iy * w - pl;
      i32 xx = 0;
      for (; xx < xa; xx++) dst[xx] = 0.f;
      for (; xx + 4 <= xb; xx += 4) wasm_v128_store(dst + xx, wasm_v128_load(row + xx));
      for (; xx < xb; xx++) dst[xx] = row[xx];
      for (; xx < wp; xx++) dst[xx] = 0.f;
    }
  }
}

/* Floats of scratch past the panels that conv2d_gemm uses for the padded planes (ops_linalg.py
 * sizes the same): 8 of slack on either side, because a panel that crosses into the next output
 * row loads 8 floats around each of its two runs. 0 where im2col reads the input itself: other
 * column strides, a plain 1x1 convolution, and planes over CONV_PAD_MAX floats (large images,
 * whose panels mostly sit inside one row anyway: the copy would only add memory). */
INLINE i32 pad_floats(i32 cg, i32 sh, i32 sw, i32 kh, i32 kw, i32 dh, i32 dw, i32 oh, i32 ow, i32 plain) {
  if (sw != 1 || plain) return 0;
  const i64 n = (i64)cg * ((oh - 1) * sh + (kh - 1) * dh + 1) * (ow + (kw - 1) * dw);
  return n > CONV_PAD_MAX ? 0 : (i32)n + 16;
}

#define GATHER_LANE(l) const i32 i##l = l < lanes ? ((first + l) / ow) * sh * wp + (first + l) % ow : -1;
#define GATHER_PUT(l) dst[l] = i##l >= 0 ? src[i##l] : 0.f;

/* im2col of positions p0 .. p0 + np - 1 into panels (as im2col_panels) from padded planes
 * (pad_planes), column stride 1: a tap reads the same offsets of the panel's positions in every
 * plane, with no bounds tests. Positions in one output row are one run of 8 floats (two vector
 * loads); positions that cross into the next row two runs (four loads, a lane select); rows
 * shorter than 8 or a short last panel a gather. */
static void im2col_padded(const f32 *pad, f32 *P, i32 cg, i32 hp, i32 wp, i32 kh, i32 kw, i32 sh, i32 dh,
                          i32 dw, i32 ow, i32 p0, i32 np) {
  const i32 K = cg * kh * kw, plane = hp * wp;
  for (i32 q = 0; q * GEMM_NR < np; q++) {
    f32 *dst = P + q * K * GEMM_NR;
    const i32 first = p0 + q * GEMM_NR, lanes = np - q * GEMM_NR < GEMM_NR ? np - q * GEMM_NR : GEMM_NR;
    const i32 oy = first / ow, ox = first % ow, m = ow - ox;
    const i32 a = oy * sh * wp + ox, b = (oy + 1) * sh * wp - m;   /* lane l: a + l, or b + l */
    if (lanes == GEMM_NR && (m >= GEMM_NR || ow >= GEMM_NR)) {
      const v128_t idx0 = wasm_i32x4_make(0, 1, 2, 3), idx1 = wasm_i32x4_make(4, 5, 6, 7);
      const v128_t mk0 = wasm_i32x4_lt(idx0, wasm_i32x4_splat(m)), mk1 = wasm_i32x4_lt(idx1, wasm_i32x4_splat(m));
      const i32 split = m < GEMM_NR;
      for (i32 ci = 0; ci < cg; ci++) {
        const f32 *src = pad + ci * plane;
        for (i32 ky = 0; ky < kh; ky++)
          for (i32 kx = 0; kx < kw; kx++, dst += GEMM_NR) {
            const f32 *s = src + ky * dh * wp + kx * dw;
            f32x4 lo0 = wasm_v128_load(s + a), lo1 = wasm_v128_load(s + a + 4);
            if (split) {
              lo0 = wasm_v128_bitselect(lo0, wasm_v128_load(s + b), mk0);
              lo1 = wasm_v128_bitselect(lo1, wasm_v128_load(s + b + 4), mk1);
            }
            wasm_v128_store(dst, lo0);
            wasm_v128_store(dst + 4, lo1);
          }
      }
      continue;
    }
    GATHER_LANE(0) GATHER_LANE(1) GATHER_LANE(2) GATHER_LANE(3)
    GATHER_LANE(4) GATHER_LANE(5) GATHER_LANE(6) GATHER_LANE(7)
    for (i32 ci = 0; ci < cg; ci++)
      for (i32 ky = 0; ky < kh; ky++)
        for (i32 kx = 0; kx < kw; kx++, dst += GEMM_NR) {
          const f32 *src = pad + ci * plane + ky * dh * wp + kx * dw;
          GATHER_PUT(0) GATHER_PUT(1) GATHER_PUT(2) GATHER_PUT(3)
          GATHER_PUT(4) GATHER_PUT(5) GATHER_PUT(6) GATHER_PUT(7)
        }
  }
}
#undef GATHER_LANE
#undef GATHER_PUT

/* ---- direct convolution from the padded planes (no im2col) ----------------------------------
 * With column stride 1, the input under tap k = (ci, ky, kx) of output positions (oy, ox .. ox + 7)
 * is 8 consecutive floats of the padded planes, at src + offs[k] with src = pad + oy * sh * wp + ox
 * and offs[k] = ci * plane + ky * dh * wp + kx * dw. So the 4x8 tile (4 output channels, 8
 * positions of one output row) reads B straight from the planes: no panels are written. Each row
 * of ow outputs takes ceil(ow / 8) tiles; the lanes past ow read floats of the next padded row
 * (or up to 7 past the last plane: the scratch's 8 floats of slack) and are never stored.
 * Every output gets the same float operations in the same order as im2col + gemm_packed_one
 * (the bias, then k = 0 .. K - 1 one FMA each, relu, store; gemm's K blocks store and reload
 * exactly), so the bits are the same. Used where at most 1/8 of the lanes are wasted
 * (conv_direct_ok). */

INLINE void conv_tile(const i32 R, const f32 *a, const f32 *src, const i32 *o, const i32 *oend, f32 *c, i32 ldc,
                      i32 nr, const f32 *bias, i32 relu) {
  const f32x4 z = wasm_f32x4_splat(0.f);
  f32x4 x00 = z, x01 = z, x10 = z, x11 = z, x20 = z, x21 = z, x30 = z, x31 = z;
  if (bias) {
#define CT_BIAS(r) x##r##0 = x##r##1 = wasm_v128_load32_splat(bias + r);
    ROWS(CT_BIAS)
  }
  /* a: the rows packed as gemm's pack_a does (step k's R weights at a[k * MR + r]) */
  for (; o != oend; o++, a += GEMM_MR) {
    const f32 *s = src + *o;
    const f32x4 b0 = wasm_v128_load(s), b1 = wasm_v128_load(s + 4);
#define CT_STEP(r) { const f32x4 w = wasm_v128_load32_splat(a + r); FMA(x##r##0, w, b0); FMA(x##r##1, w, b1); }
    ROWS(CT_STEP)
  }
  if (relu) {
#define CT_RELU(r) x##r##0 = wasm_f32x4_pmax(x##r##0, z); x##r##1 = wasm_f32x4_pmax(x##r##1, z);
    ROWS(CT_RELU)
  }
  f32 *c0 = c, *c1 = c0 + ldc, *c2 = c1 + ldc, *c3 = c2 + ldc;
#define CT_STORE(r) store_n(c##r, nr, x##r##0, x##r##1);
  ROWS(CT_STORE)
#undef CT_BIAS
#undef CT_STEP
#undef CT_RELU
#undef CT_STORE
}

/* (its own function, as gemm's micro_packed: inlined into the loops below, V8 kept the tile's
 * accumulators in memory and the direct form ran at 0.6x the im2col one) */
static __attribute__((noinline)) void conv_tile_mr(i32 mr, const f32 *a, const f32 *src, const i32 *o,
                                                   const i32 *oend, f32 *c, i32 ldc, i32 nr, const f32 *bias,
                                                   i32 relu) {
  switch (mr) {
    case 4: conv_tile(4, a, src, o, oend, c, ldc, nr, bias, relu); break;
    case 3: conv_tile(3, a, src, o, oend, c, ldc, nr, bias, relu); break;
    case 2: conv_tile(2, a, src, o, oend, c, ldc, nr, bias, relu); break;
    default: conv_tile(1, a, src, o, oend, c, ldc, nr, bias, relu); break;
  }
}

/* Output channels r0 .. r1 - 1 of a group (weights wg, K apart; bias bg or 0) at every position,
 * from the padded planes; ap: room for the rows' weights packed by 4 (K * 4 floats a block). */
static void conv_direct_rows(const f32 *wg, const f32 *bg, const f32 *pad, const i32 *offs, f32 *ap, f32 *yg,
                             i32 K, i32 r0, i32 r1, i32 oh, i32 ow, i32 sh, i32 wp, i32 relu) {
  const i32 npos = oh * ow;
  for (i32 r = r0; r < r1; r += GEMM_MR) {
    const i32 mr = r1 - r < GEMM_MR ? r1 - r : GEMM_MR;
    const f32 *br = bg ? bg + r : 0;
    for (i32 k = 0; k < K; k++)
      for (i32 q = 0; q < GEMM_MR; q++) ap[k * GEMM_MR + q] = q < mr ? wg[(r + q) * K + k] : 0.f;
    for (i32 oy = 0; oy < oh; oy++)
      for (i32 ox = 0; ox < ow; ox += GEMM_NR) {
        const i32 nr = ow - ox < GEMM_NR ? ow - ox : GEMM_NR;
        const f32 *src = pad + oy * sh * wp + ox;
        f32 *c = yg + r * npos + oy * ow + ox;
        conv_tile_mr(mr, ap, src, offs, offs + K, c, npos, nr, br, relu);
      }
  }
}

/* The direct form pays for ceil(ow / 8) * 8 lanes per output row: used where that is at most 1/8
 * more than ow (MNIST's 28 and 14, and 7, 8, 16, ...). */
INLINE i32 conv_direct_ok(i32 ow) {
  const i32 lanes = (ow + GEMM_NR - 1) / GEMM_NR * GEMM_NR;
  return (lanes - ow) * 8 <= lanes;
}

/* One thread's share (team.h): per chunk of positions, the chunk's panels packed by panel ranges,
 * a barrier, then the output channels split in grains of 4 rows (a barrier again before the next
 * chunk reuses the scratch). */
void conv2d_gemm_team(const f32 *x, const f32 *wt, const f32 *bias, f32 *y, f32 *scratch, const i32 *prm,
                      i32 *ctl, i32 tid, i32 nt) {
  const i32 n = prm[CONV_N], c = prm[CONV_C], h = prm[CONV_H], w = prm[CONV_W], o = prm[CONV_O];
  const i32 groups = prm[CONV_GROUPS], kh = prm[CONV_KH], kw = prm[CONV_KW];
  const i32 sh = prm[CONV_SH], sw = prm[CONV_SW], pt = prm[CONV_PT], pl = prm[CONV_PL];
  const i32 dh = prm[CONV_DH], dw = prm[CONV_DW], oh = prm[CONV_OH], ow = prm[CONV_OW];
  const i32 chunk = prm[CONV_CHUNK], flags = prm[CONV_FLAGS];
  const i32 cg = c / groups, og = o / groups, K = cg * kh * kw, npos = oh * ow;
  const i32 plain = kh == 1 && kw == 1 && sh == 1 && sw == 1 && pt == 0 && pl == 0;
  const i32 width = team_width(ctl, nt, (i64)chunk * og * K);
  /* column stride 1: patches come from a zero-padded copy of the group's planes, after the panels */
  const i32 padded = pad_floats(cg, sh, sw, kh, kw, dh, dw, oh, ow, plain) > 0;
  const i32 hp = (oh - 1) * sh + (kh - 1) * dh + 1, wp = ow + (kw - 1) * dw;
  f32 *pad = scratch + ((chunk + GEMM_NR - 1) / GEMM_NR) * GEMM_NR * K + 8;
  /* direct from the padded planes (no im2col) where few lanes are wasted and every thread's K
   * offsets fit in the panels' room */
  const i32 direct = padded && conv_direct_ok(ow) && (i64)nt * (GEMM_MR + 1) * K <= (i64)((chunk + GEMM_NR - 1) / GEMM_NR) * GEMM_NR * K
                     && !(flags & CONV_IM2COL);
  for (i32 b = 0; b < n; b++)
    for (i32 g = 0; g < groups; g++) {
      const f32 *xg = x + (b * c + g * cg) * h * w;
      const f32 *wg = wt + g * og * K;
      const f32 *bg = bias ? bias + g * og : 0;
      f32 *yg = y + (b * o + g * og) * npos;
      if (padded) {   /* (the barrier at the first chunk's start orders this before any im2col) */
        i32 c0, c1;
        team_range(cg, 1, tid, width, &c0, &c1);
        pad_planes(xg, pad, h, w, hp, wp, pt, pl, c0, c1);
      }
      if (direct) {
        /* the taps' offsets in the panels' room (each thread writes the same values to its own
         * K words), a barrier (the planes are copied), then output channels in grains of 4 */
        i32 *offs = (i32 *)scratch + tid * (GEMM_MR + 1) * K, k = 0;
        f32 *ap = scratch + tid * (GEMM_MR + 1) * K + K;
        for (i32 ci = 0; ci < cg; ci++)
          for (i32 ky = 0; ky < kh; ky++)
            for (i32 kx = 0; kx < kw; kx++) offs[k++] = ci * hp * wp + ky * dh * wp + kx * dw;
        if (width > 1) team_sync(ctl, tid, nt);
        i32 r0, r1;
        team_range(og, GEMM_MR, tid, width, &r0, &r1);
        if (r0 < r1) conv_direct_rows(wg, bg, pad, offs, ap, yg, K, r0, r1, oh, ow, sh, wp, (flags & GEMM_RELU) != 0);
        if (width > 1) team_sync(ctl, tid, nt);   /* the next group's copy reuses the planes */
        continue;
      }
      for (i32 p0 = 0; p0 < npos; p0 += chunk) {
        const i32 np = npos - p0 < chunk ? npos - p0 : chunk;
        i32 lo, hi, r0, r1;
        team_range(np, GEMM_NR, tid, width, &lo, &hi);
        if (width > 1) team_sync(ctl, tid, nt);   /* the previous chunk's products are done */
        if (lo < hi) {
          if (plain)
            gemm_pack_rows(xg + p0 + lo, npos, scratch + lo * K, K, hi - lo);
          else if (padded)
            im2col_padded(pad, scratch + lo * K, cg, hp, wp, kh, kw, sh, dh, dw, ow, p0 + lo, hi - lo);
          else
            im2col_panels(xg, scratch + lo * K, cg, h, w, kh, kw, sh, sw, pt, pl, dh, dw, ow, p0 + lo, hi - lo);
        }
        if (width > 1) team_sync(ctl, tid, nt);
        team_range(og, 4, tid, width, &r0, &r1);
        if (r0 < r1)
          gemm_packed_one(wg + r0 * K, K, scratch, yg + r0 * npos + p0, npos, r1 - r0, np, K, bg ? bg + r0 : 0, flags);
      }
    }
}

EXPORT(conv2d_gemm) void conv2d_gemm(const f32 *x, const f32 *wt, const f32 *bias, f32 *y, f32 *scratch,
                                     const i32 *prm) {
  conv2d_gemm_team(x, wt, bias, y, scratch, prm, 0, 0, 1);
}

/* One output of a depthwise row with every tap bounds-checked (the row's edges): kernel rows
 * ky0 .. ky1 - 1 land on image rows iy0 + (ky - ky0) * dh. */
INLINE f32 dw_point(const f32 *plane, const f32 *k, i32 ky0, i32 ky1, i32 iy0, i32 dh, i32 w, i32 kw,
                    i32 ix0, i32 dw, f32 acc) {
  for (i32 ky = ky0; ky < ky1; ky++) {
    const f32 *row = plane + (iy0 + (ky - ky0) * dh) * w, *kr = k + ky * kw;
    for (i32 kx = 0; kx < kw; kx++) {
      const i32 ix = ix0 + kx * dw;
      if (ix >= 0 && ix < w) acc += kr[kx] * row[ix];
    }
  }
  return acc;
}

/* y[b, oc] for oc = ci * mult + m from input channel ci alone (groups == c, weight (o, 1, kh, kw)).
 * Each output sums its taps in a register; in a row's interior (every tap inside the image) four
 * outputs at a time for strides 1 and 2. */
EXPORT(conv2d_depthwise) void conv2d_depthwise(const f32 *x, const f32 *wt, const f32 *bias, f32 *y,
                                               const i32 *prm) {
  const i32 n = prm[CONV_N], c = prm[CONV_C], h = prm[CONV_H], w = prm[CONV_W], o = prm[CONV_O];
  const i32 kh = prm[CONV_KH], kw = prm[CONV_KW];
  const i32 sh = prm[CONV_SH], sw = prm[CONV_SW], pt = prm[CONV_PT], pl = prm[CONV_PL];
  const i32 dh = prm[CONV_DH], dw = prm[CONV_DW], oh = prm[CONV_OH], ow = prm[CONV_OW];
  const i32 relu = (prm[CONV_FLAGS] & GEMM_RELU) != 0;
  const i32 mult = o / c;
  /* interior columns: ox * sw - pl >= 0 and ox * sw - pl + (kw - 1) * dw <= w - 1 */
  const i32 right = w - 1 - (kw - 1) * dw + pl;
  i32 xa = (pl + sw - 1) / sw, xb = right >= 0 ? right / sw + 1 : 0;
  if (xb > ow) xb = ow;
  if (xa > xb) xa = xb;
  for (i32 b = 0; b < n; b++)
    for (i32 oc = 0; oc < o; oc++) {
      const f32 *plane = x + (b * c + oc / mult) * h * w;
      const f32 *k = wt + oc * kh * kw;
      const f32 b0 = bias ? bias[oc] : 0.f;
      f32 *out = y + (b * o + oc) * oh * ow;
      for (i32 oy = 0; oy < oh; oy++, out += ow) {
        /* the kernel rows inside the image: 0 <= oy * sh - pt + ky * dh < h, a range of ky */
        const i32 top = oy * sh - pt;
        i32 ky0 = top >= 0 ? 0 : (-top + dh - 1) / dh;
        i32 ky1 = h - top <= 0 ? 0 : (h - top + dh - 1) / dh;
        if (ky1 > kh) ky1 = kh;
        if (ky0 > ky1) ky0 = ky1;
        const i32 iy0 = top + ky0 * dh;
        i32 ox = 0;
        for (; ox < xa; ox++) out[ox] = dw_point(plane, k, ky0, ky1, iy0, dh, w, kw, ox * sw - pl, dw, b0);
        if (sw == 1) {   /* 16 outputs per step: each weight splat once for four vectors */
          for (; ox + 16 <= xb; ox += 16) {
            f32x4 a0 = wasm_f32x4_splat(b0), a1 = a0, a2 = a0, a3 = a0;
            for (i32 ky = ky0; ky < ky1; ky++) {
              const f32 *row = plane + (iy0 + (ky - ky0) * dh) * w + ox - pl, *kr = k + ky * kw;
              for (i32 kx = 0; kx < kw; kx++) {
                const f32 *src = row + kx * dw;
                const f32x4 wv = wasm_f32x4_splat(kr[kx]);
                a0 = wasm_f32x4_add(a0, wasm_f32x4_mul(wv, wasm_v128_load(src)));
                a1 = wasm_f32x4_add(a1, wasm_f32x4_mul(wv, wasm_v128_load(src + 4)));
                a2 = wasm_f32x4_add(a2, wasm_f32x4_mul(wv, wasm_v128_load(src + 8)));
                a3 = wasm_f32x4_add(a3, wasm_f32x4_mul(wv, wasm_v128_load(src + 12)));
              }
            }
            wasm_v128_store(out + ox, a0);
            wasm_v128_store(out + ox + 4, a1);
            wasm_v128_store(out + ox + 8, a2);
            wasm_v128_store(out + ox + 12, a3);
          }
        }
        if (sw == 1 || sw == 2) {
          /* stride 2 reads 8 inputs for 4 outputs: keep the 8th inside the row too */
          for (; ox + 4 <= xb && (sw == 1 || 2 * (ox + 3) - pl + (kw - 1) * dw + 1 < w); ox += 4) {
            f32x4 acc = wasm_f32x4_splat(b0);
            for (i32 ky = ky0; ky < ky1; ky++) {
              const f32 *row = plane + (iy0 + (ky - ky0) * dh) * w + ox * sw - pl, *kr = k + ky * kw;
              for (i32 kx = 0; kx < kw; kx++) {
                const f32 *src = row + kx * dw;
                f32x4 v = wasm_v128_load(src);
                if (sw == 2) v = wasm_i32x4_shuffle(v, wasm_v128_load(src + 4), 0, 2, 4, 6);
                acc = wasm_f32x4_add(acc, wasm_f32x4_mul(wasm_f32x4_splat(kr[kx]), v));
              }
            }
            wasm_v128_store(out + ox, acc);
          }
        }
        for (; ox < xb; ox++) {   /* interior, one at a time: no bounds checks needed */
          f32 acc = b0;
          for (i32 ky = ky0; ky < ky1; ky++) {
            const f32 *row = plane + (iy0 + (ky - ky0) * dh) * w + ox * sw - pl, *kr = k + ky * kw;
            for (i32 kx = 0; kx < kw; kx++) acc += kr[kx] * row[kx * dw];
          }
          out[ox] = acc;
        }
        for (; ox < ow; ox++) out[ox] = dw_point(plane, k, ky0, ky1, iy0, dh, w, kw, ox * sw - pl, dw, b0);
        if (relu)
          for (ox = 0; ox < ow; ox++) out[ox] = out[ox] < 0.f ? 0.f : out[ox];
      }
    }
}

/* Transposed convolution, weight (c, og, kh, kw): per (batch, group), cols = W_g^T · X_g (a GEMM:
 * one row per (output channel, ky, kx), one column per input position), then every column
 * element is added to the output pixel it lands on (col2im). Input positions go in chunks so
 * cols stays small. scratch: W_g^T for all groups (o * kh * kw * cg floats), then X's chunk in
 * packed panels (panels(cg, chunk)), then cols (og * kh * kw * chunk). */
EXPORT(conv_transpose2d_gemm) void conv_transpose2d_gemm(const f32 *x, const f32 *wt, const f32 *bias, f32 *y,
                                                         f32 *scratch, const i32 *prm) {
  const i32 n = prm[CONV_N], c = prm[CONV_C], h = prm[CONV_H], w = prm[CONV_W], o = prm[CONV_O];
  const i32 groups = prm[CONV_GROUPS], kh = prm[CONV_KH], kw = prm[CONV_KW];
  const i32 sh = prm[CONV_SH], sw = prm[CONV_SW], pt = prm[CONV_PT], pl = prm[CONV_PL];
  const i32 dh = prm[CONV_DH], dw = prm[CONV_DW], oh = prm[CONV_OH], ow = prm[CONV_OW];
  const i32 chunk = prm[CONV_CHUNK];
  const i32 cg = c / groups, og = o / groups, taps = kh * kw, M = og * taps, npos = h * w;
  f32 *wT = scratch, *P = wT + groups * M * cg, *cols = P + ((chunk + GEMM_NR - 1) / GEMM_NR) * GEMM_NR * cg;
  /* W_g (cg, M) -> W_g^T (M, cg) for every group */
  for (i32 g = 0; g < groups; g++)
    for (i32 ci = 0; ci < cg; ci++)
      for (i32 r = 0; r < M; r++) wT[(g * M + r) * cg + ci] = wt[(g * cg + ci) * M + r];
  for (i32 b = 0; b < n; b++) {
    for (i32 oc = 0; oc < o; oc++) {
      const f32 v = bias ? bias[oc] : 0.f;
      f32 *plane = y + (b * o + oc) * oh * ow;
      for (i32 i = 0; i < oh * ow; i++) plane[i] = v;
    }
    for (i32 g = 0; g < groups; g++) {
      const f32 *xg = x + (b * c + g * cg) * npos;
      for (i32 p0 = 0; p0 < npos; p0 += chunk) {
        const i32 np = npos - p0 < chunk ? npos - p0 : chunk;
        gemm_pack_rows(xg + p0, npos, P, cg, np);
        gemm_packed_one(wT + g * M * cg, cg, P, cols, np, M, np, cg, 0, 0);
        for (i32 r = 0; r < M; r++) {
          const i32 oc = g * og + r / taps, ky = (r / kw) % kh, kx = r % kw;
          f32 *plane = y + (b * o + oc) * oh * ow;
          const f32 *src = cols + r * np;
          i32 iy = p0 / w, ix = p0 % w;
          for (i32 q = 0; q < np; q++) {
            const i32 oy = iy * sh - pt + ky * dh, ox = ix * sw - pl + kx * dw;
            if (oy >= 0 && oy < oh && ox >= 0 && ox < ow) plane[oy * ow + ox] += src[q];
            if (++ix == w) { ix = 0; iy++; }
          }
        }
      }
    }
  }
}
