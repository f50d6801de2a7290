/* A second thread for the kernels, handed work without Python in between (numpy_nn.Team).
 *
 * numpy_blas.parallel_for hands items to a Python helper thread: the helper wakes on a condition
 * variable and then needs the GIL, and the caller waits on a lock at the end; on this file's first
 * machine (a 2-vCPU VM) that cost 20-50 us per call, about what splitting a 100-300 us kernel saves.
 * Here the helper is a Python thread that calls ember_team_serve, which (the GIL released) spins on
 * the control block, runs the items it claims, and returns only when parked or idle for a while;
 * the caller (ember_team_run) publishes a job, runs items itself, and spins until all are done. A
 * helper that is not spinning (parked, or busy elsewhere) takes no item: the caller runs them all.
 *
 * The control block is int64s of Python's (no globals here): [0] the claim word, (job generation
 * << 16) | next item, (generation, LOCKED) while the caller writes the job; [1] items done; [2] the
 * job's kind, [3] its argument array, [4..7] its per-call pointers, [8] item count, [9] the first
 * error code, [10] 1 while the helper spins, [11] 1 to park it, [12] the generation. Items claim by
 * compare-and-swap on the claim word: a claim succeeds only while the job it read is current, and a
 * job's fields change only after the claim word has moved on (LOCKED first), so a claimed item
 * always reads its own job's fields; the caller returns only when every item is done.
 *
 * Each kernel's items are ranges of its own units (rows, pixels, planes, heads), whole blocks of
 * its alignment: an output does not depend on the range it falls in, so results are the same bits
 * on one thread or two. */
#define _POSIX_C_SOURCE 200809L      /* (clock_gettime under -std=c11) */
#include "ember_native.h"
#include <sched.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define PAUSE() __asm__ __volatile__("yield")
#else
#define PAUSE() ((void)0)
#endif

enum { T_CLAIM, T_DONE, T_KIND, T_ARGS, T_D0, T_D1, T_D2, T_D3, T_N, T_ERR, T_SPIN, T_PARK, T_GEN, T_LEN };
#define LOCKED 0xffff
#define LD(p) __atomic_load_n(p, __ATOMIC_SEQ_CST)
#define ST(p, v) __atomic_store_n(p, v, __ATOMIC_SEQ_CST)

/* kinds of job: the kernels with their arguments (args, the job's array; d the per-call pointers):
 *   1 ember_linear: args [lnw, lnb, wp, bias, g, ap, scratch0, scratch1, scratch_len, M]; d [x, y, res]
 *   2 ember_conv_depthwise_act: args [w, bias, g, ap, act, scratch0, scratch1, scratch_len, planes]; d [x, y]
 *   3 ember_conv_gemm by output channels: args [wp, bias, g, ap, M]; d [x, y]
 *   4 ember_conv_direct: args [wp, bias, g, ap, panel0, panel1, panel_len, npix]; d [x, y]
 *   5 ember_gemv: args [w, bias, g, ap, M]; d [x, y]
 *   6 ember_attention: args [g, c (float bits), scratch0, scratch1, scratch_len, units]; d [q, k, v, y]
 *   7 ember_qdot_linear by weight rows: args [qtype, m, n, k, row bytes, ldy, scratch bytes a thread];
 *     d [x, y, w, scratch (two threads' parts, scratch bytes apart)]; each item quantizes x itself
 *     (m * k elements: well under a microsecond) into its thread's part
 *   8 ember_qdot_linear over the rows of several weights of one format that read the same x (a
 *     layer's q, k and v products): args [qtype, m, parts, k, row bytes, ldy, scratch bytes a
 *     thread, then per part its weight's address and rows]; d as job 7 (d[2] unused). The parts'
 *     outputs lie side by side in y's rows (part i from column rows_0 + ... + rows_(i-1)); the
 *     units are the parts' rows each rounded up to 16 (so a range cuts a part only at a multiple
 *     of 16 of its own rows, as job 7 does), each piece of a part computed as job 7 computes it
 *   9 ember_attn_decode_units (attn.c: one query row over a key/value cache, units (key/value
 *     head, chunk of rows)): args attn.c's AD_ array; d [q, k, v, part]
 * and the alignment of their ranges (units per block) */
enum { J_LINEAR = 1, J_DEPTHWISE, J_GEMM, J_DIRECT, J_GEMV, J_ATTENTION, J_QDOT, J_QDOT_PARTS, J_ATTN_DECODE,
       J_COUNT };

EXPORT i64 ember_conv_depthwise_act(const f32 *x, const f32 *w, const f32 *bias, f32 *y, const i64 *g,
                                    const f32 *ap, i64 act, f32 *scratch, i64 scratch_len, i64 p0, i64 p1);
EXPORT i64 ember_conv_gemm(const f32 *wp, const f32 *x, const f32 *bias, f32 *y, const i64 *g, const f32 *ap,
                           i64 n0, i64 n1);
EXPORT i64 ember_conv_direct(const f32 *wp, const f32 *x, const f32 *bias, f32 *y, const i64 *g, const f32 *ap,
                             f32 *panel, i64 panel_len, i64 r0, i64 r1);
EXPORT i64 ember_linear(const f32 *a, const f32 *lnw, const f32 *lnb, const f32 *wp, const f32 *bias,
                        const f32 *res, f32 *y, const i64 *g, const f32 *ap, f32 *scratch, i64 scratch_len,
                        i64 m0, i64 m1);
EXPORT i64 ember_attention(const f32 *q, const f32 *k, const f32 *v, f32 *y, const i64 *g, f32 c, f32 *scratch,
                           i64 scratch_len, i64 u0, i64 u1);
EXPORT i64 ember_attn_decode_units(const i64 *a, const f32 *q, const f32 *k, const f32 *v, f32 *part, i64 u0,
                                   i64 u1);

#define F(i) ((f32 *)(intptr_t)a[i])
#define I(i) ((const i64 *)(intptr_t)a[i])
#define D(i) ((f32 *)(intptr_t)d[i])

/* (units, alignment) of a job */
static void units_of(i64 kind, const i64 *a, i64 *units, i64 *align) {
  switch (kind) {
    case J_LINEAR: *units = a[9], *align = 8; break;
    case J_DEPTHWISE: *units = a[8], *align = 1; break;
    case J_GEMM: *units = a[4], *align = 8; break;
    case J_DIRECT: *units = a[7], *align = 32; break;
    case J_GEMV: *units = a[4], *align = 8; break;
    case J_QDOT: *units = a[2], *align = 16; break;     /* (qdot.c's groups of 16 rows) */
    case J_ATTN_DECODE: *units = a[6], *align = 1; break;   /* (attn.c's AD_UNITS) */
    case J_QDOT_PARTS: {
      i64 u = 0;
      for (i64 i = 0; i < a[2]; i++) u += (a[8 + 2 * i] + 15) / 16 * 16;
      *units = u, *align = 16;
      break;
    }
    default: *units = a[5], *align = 1; break;
  }
}

static i64 run_item(i64 kind, const i64 *a, const i64 *d, i64 item, i64 n, int tid) {
  i64 units, align;
  units_of(kind, a, &units, &align);
  const i64 blocks = (units + align - 1) / align;
  i64 lo = align * (blocks * item / n), hi = align * (blocks * (item + 1) / n);
  if (hi > units) hi = units;
  if (lo >= hi) return 0;
  switch (kind) {
    case J_LINEAR:
      return ember_linear(D(0), F(0), F(1), F(2), F(3), D(2), D(1), I(4), F(5), F(6 + tid), a[8], lo, hi);
    case J_DEPTHWISE:
      return ember_conv_depthwise_act(D(0), F(0), F(1), D(1), I(2), F(3), a[4], F(5 + tid), a[7], lo, hi);
    case J_GEMM: {       /* (whole panels of 8 output channels: the packed weight's, the bias's and y's rows) */
      const i64 *g = I(2);
      i64 g2[6] = {hi - lo, g[1], g[2], g[3], g[4], g[5]};
      return ember_conv_gemm(F(0) + lo * g[1], D(0), a[1] ? F(1) + lo : NULL, D(1) + lo * g[4], g2, F(3), 0, g[2]);
    }
    case J_DIRECT:
      return ember_conv_direct(F(0), D(0), F(1), D(1), I(2), F(3), F(4 + tid), a[6], lo, hi);
    case J_GEMV:
      return ember_gemv(F(0), D(0), F(1), D(1), I(2), F(3), lo, hi);
    case J_ATTENTION: {
      f32 c;
      int32_t bits = (int32_t)a[1];
      __builtin_memcpy(&c, &bits, 4);
      return ember_attention(D(0), D(1), D(2), D(3), I(0), c, F(2 + tid), a[4], lo, hi);
    }
    case J_QDOT:
      return ember_qdot_linear((const char *)D(2) + lo * a[4], D(0), D(1) + lo, a[5], (char *)D(3) + tid * a[6],
                               a[0], a[1], hi - lo, a[3]);
    case J_ATTN_DECODE:
      return ember_attn_decode_units(a, D(0), D(1), D(2), D(3), lo, hi);
    case J_QDOT_PARTS: {     /* (each part's rows that fall in [lo, hi) of the padded units) */
      char *scratch = (char *)D(3) + tid * a[6];
      for (i64 i = 0, u0 = 0, y0 = 0; i < a[2] && u0 < hi; i++) {
        const i64 rows = a[8 + 2 * i], r0 = lo > u0 ? lo - u0 : 0, r1 = hi - u0 < rows ? hi - u0 : rows;
        if (r1 > r0) {
          const i64 rc = ember_qdot_linear((const char *)(intptr_t)a[7 + 2 * i] + r0 * a[4], D(0), D(1) + y0 + r0,
                                           a[5], scratch, a[0], a[1], r1 - r0, a[3]);
          if (rc) return rc;
        }
        u0 += (rows + 15) / 16 * 16, y0 += rows;
      }
      return 0;
    }
    default:
      return -1;
  }
}

/* claim and run items of the current job (generation gen) until none are left */
static void work(i64 *ctl, i64 gen, int tid) {
  for (;;) {
    i64 v = LD(&ctl[T_CLAIM]);
    if ((v >> 16) != gen) return;
    const i64 idx = v & 0xffff;
    const i64 n = LD(&ctl[T_N]);
    if (idx == LOCKED || idx >= n) return;
    if (!__atomic_compare_exchange_n(&ctl[T_CLAIM], &v, v + 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) continue;
    /* (claimed: the job's fields stay as they are until this item is done) */
    const i64 r = run_item(LD(&ctl[T_KIND]), (const i64 *)(intptr_t)LD(&ctl[T_ARGS]), ctl + T_D0, idx, n, tid);
    if (r) {
      i64 zero = 0;
      __atomic_compare_exchange_n(&ctl[T_ERR], &zero, r, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    }
    __atomic_fetch_add(&ctl[T_DONE], 1, __ATOMIC_SEQ_CST);
  }
}

static i64 now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (i64)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* The helper's loop: spins for jobs and takes items of each until parked or idle for `idle_ns`.
 * Returns the last generation seen. */
EXPORT i64 ember_team_serve(i64 *ctl, i64 idle_ns) {
  ST(&ctl[T_SPIN], 1);
  /* (the job that woke it may still have items: work() takes them, or finds none) */
  i64 seen = LD(&ctl[T_GEN]) - 1, last = now_ns();
  for (int spins = 0;; spins++) {
    const i64 gen = LD(&ctl[T_GEN]);
    if (gen != seen) {
      seen = gen;
      work(ctl, gen, 1);
      last = now_ns();
      spins = 0;
      continue;
    }
    if (LD(&ctl[T_PARK])) break;
    if ((spins & 255) == 255) {
      if (now_ns() - last > idle_ns) break;
      sched_yield();                  /* (a process waiting for this core gets it) */
    }
    PAUSE();
  }
  ST(&ctl[T_SPIN], 0);
  return seen;
}

/* The caller: publish a job of `kind` with its argument array and per-call pointers, in `n` items
 * (n < LOCKED), run items, wait for the helper's. Returns 0, or the first nonzero code a kernel
 * returned (for any item; the outputs are then incomplete), or -1 for a bad job. */
EXPORT i64 ember_team_run(i64 *ctl, i64 kind, const i64 *args, const f32 *d0, const f32 *d1, const f32 *d2,
                          const f32 *d3, i64 n) {
  if (kind <= 0 || kind >= J_COUNT || n <= 0 || n >= LOCKED) return -1;
  const i64 gen = LD(&ctl[T_GEN]) + 1;
  ST(&ctl[T_CLAIM], (gen << 16) | LOCKED);         /* (no claim while the fields change) */
  ST(&ctl[T_KIND], kind);
  ST(&ctl[T_ARGS], (i64)(intptr_t)args);
  ST(&ctl[T_D0], (i64)(intptr_t)d0);
  ST(&ctl[T_D1], (i64)(intptr_t)d1);
  ST(&ctl[T_D2], (i64)(intptr_t)d2);
  ST(&ctl[T_D3], (i64)(intptr_t)d3);
  ST(&ctl[T_N], n);
  ST(&ctl[T_ERR], 0);
  ST(&ctl[T_DONE], 0);
  ST(&ctl[T_CLAIM], gen << 16);
  ST(&ctl[T_GEN], gen);
  work(ctl, gen, 0);
  /* the helper's items: a spin, yielding the core now and then (the helper may be waiting for it,
   * on a machine with other work) */
  for (int spins = 1; LD(&ctl[T_DONE]) < n; spins++) {
    if ((spins & 1023) == 0) sched_yield();
    PAUSE();
  }
  return LD(&ctl[T_ERR]);
}
