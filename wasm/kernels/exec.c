/* One call runs a whole command table: a replayed plan's kernel calls without Python between them.
 *
 * Python (ember/wasm/plan_exec.py) records the kernel calls a plan makes, checks every buffer
 * address and length against the buffers it owns, and encodes them as int32 words:
 *
 *   header   [0] TABLE_MAGIC  [1] EMBER_ABI  [2] number of commands  [3] number of words
 *   command  [kernel id, n argument words, expected result, argument words...]
 *
 * A kernel id numbers the exported kernels in sorted-name order (the generated ember_dispatch,
 * from wasm/build_kernels.py); arguments are pointers and i32 values as one word, f32 as its
 * bits, i64/f64 as two words (low first). Kernels that return an i32 (sin/cos report values they
 * left to Python, cast reports success) are checked against the result seen when the table was
 * recorded: a different one stops the run and returns the command's index + 1, so that Python
 * redoes that step through its wrapper and resumes the table with `start` at the next step.
 *
 * Returns 0 when every command ran; c + 1 when command c returned something else than expected;
 * -1 for a table of another ABI or magic; -2 - c when command c is malformed (unknown kernel,
 * wrong argument count, running past the table's words; c = the number of commands when words
 * are left over). The whole table is checked before its first command runs.
 *
 * Bounds: this file cannot know buffer sizes; Python checks every span when it builds the table
 * and whenever a buffer behind it could have changed (see plan_exec.py). The table is data Python
 * owns: it lives in an array.array (Pyodide) or in a plan's own memory (wasmtime).
 */
#include "ember.h"
#include "team.h"

INLINE f32 ember_word_f32(i32 w) {
  union { i32 i; f32 f; } u;
  u.i = w;
  return u.f;
}

INLINE i64 ember_word_i64(i32 lo, i32 hi) { return (i64)(((unsigned long long)(u32)hi << 32) | (u32)lo); }

INLINE double ember_word_f64(i32 lo, i32 hi) {
  union { unsigned long long i; double f; } u;
  u.i = ((unsigned long long)(u32)hi << 32) | (u32)lo;
  return u.f;
}

#include "ember_dispatch.h"

#define TABLE_MAGIC 0x54424d45 /* "EMBT" little-endian */
#define HEADER 4

EXPORT(ember_abi) i32 ember_abi(void) { return (i32)EMBER_ABI; }

/* Flip bit 0 of each of the n elements (itemsize bytes, little-endian) at p: the perturbation
 * plan_exec.py applies to a step's data inputs while it checks that the step's wrapper reads no
 * value in Python (its own inverse; every value changes: floats by one unit in the last place,
 * integers by one). */
EXPORT(ember_flip_bit0) void ember_flip_bit0(unsigned char *p, i32 n, i32 itemsize) {
  for (i32 i = 0; i < n; i++) p[i * itemsize] ^= 1;
}

/* 0 when the whole table is well formed, else what ember_run returns for it. */
static i32 table_check(const i32 *t) {
  if (t[0] != TABLE_MAGIC || t[1] != (i32)EMBER_ABI) return -1;
  const i32 n = t[2], words = t[3];
  i32 at = HEADER;
  for (i32 c = 0; c < n; c++) {
    if (at > words - 3) return -2 - c;
    const i32 nargs = t[at + 1];
    if (nargs < 0 || nargs > words - at - 3) return -2 - c;
    if (ember_dispatch(t[at], t + at + 3, nargs, 0) < 0) return -2 - c;
    at += 3 + nargs;
  }
  if (at != words) return -2 - n;
  return 0;
}

EXPORT(ember_run) i32 ember_run(const i32 *t, i32 start) {
  const i32 bad = table_check(t);
  if (bad) return bad;
  i32 at = HEADER;
  for (i32 c = 0; c < t[2]; c++) {
    const i32 nargs = t[at + 1];
    if (c >= start) {
      const i64 r = ember_dispatch(t[at], t + at + 3, nargs, 1);
      if ((r >> 32) && (i32)r != t[at + 2]) return c + 1;
    }
    at += 3 + nargs;
  }
  return 0;
}

/* ---- a team of threads on one table (team.h; wasm/team.py starts the workers) ---------- */

#define P_(T, k) ((T)(__UINTPTR_TYPE__)(u32)a[k])

/* The kernels that split their work: their team version on argument words a, as ember_dispatch
 * returns (has_result << 32 | result); -1 for every other kernel. */
static i64 team_dispatch(i32 id, const i32 *a, i32 *ctl, i32 tid, i32 nt, i32 run) {
  switch (id) {
    case EMBER_KID_gemm:
      if (run) gemm_team(P_(const f32 *, 0), P_(const f32 *, 1), P_(f32 *, 2), P_(f32 *, 3), P_(const f32 *, 4),
                         P_(const i32 *, 5), ctl, tid, nt);
      return 0;
    case EMBER_KID_conv2d_gemm:
      if (run) conv2d_gemm_team(P_(const f32 *, 0), P_(const f32 *, 1), P_(const f32 *, 2), P_(f32 *, 3),
                                P_(f32 *, 4), P_(const i32 *, 5), ctl, tid, nt);
      return 0;
    case EMBER_KID_sdpa_f32:
      if (run) sdpa_f32_team(P_(const f32 *, 0), P_(const f32 *, 1), P_(const f32 *, 2), P_(const void *, 3),
                             P_(f32 *, 4), P_(f32 *, 5), P_(const i32 *, 6), ember_word_f32(a[7]), ctl, tid, nt);
      return 0;
    case EMBER_KID_q_linear:
      if (!run) return 0;
      return ((i64)1 << 32) | (u32)q_linear_team(P_(const void *, 0), P_(const f32 *, 1), P_(f32 *, 2),
                                                 P_(f32 *, 3), P_(const i32 *, 4), ctl, tid, nt);
    case EMBER_KID_attention_cached_f32:
      if (!run) return 0;
      return ((i64)1 << 32) | (u32)attention_cached_f32_team(P_(const f32 *, 0), P_(const f32 *, 1),
                                                             P_(const f32 *, 2), P_(f32 *, 3), P_(f32 *, 4),
                                                             P_(const i32 *, 5), P_(f32 *, 6), P_(f32 *, 7),
                                                             P_(const i32 *, 8), ember_word_f32(a[9]), ctl, tid, nt);
    /* elementwise maps and same-shape binary ops: ranges of elements (grains of 64: every
     * element goes through the same lanes' code as in one call); layer_norm: ranges of rows */
#define TEAM_MAP(NAME, COST)                                                                    \
    case EMBER_KID_##NAME:                                                                      \
      if (run) {                                                                                \
        i32 lo, hi;                                                                             \
        team_range(a[2], 64, tid, team_width(ctl, nt, (i64)a[2] * COST), &lo, &hi);             \
        if (lo < hi) NAME(P_(const f32 *, 0) + lo, P_(f32 *, 1) + lo, hi - lo);                 \
      }                                                                                         \
      return 0;
#define TEAM_VV(NAME)                                                                           \
    case EMBER_KID_##NAME:                                                                      \
      if (run) {                                                                                \
        i32 lo, hi;                                                                             \
        team_range(a[3], 64, tid, team_width(ctl, nt, (i64)a[3] * 2), &lo, &hi);                \
        if (lo < hi) NAME(P_(const f32 *, 0) + lo, P_(const f32 *, 1) + lo, P_(f32 *, 2) + lo, hi - lo); \
      }                                                                                         \
      return 0;
    TEAM_MAP(gelu_f32, 24) TEAM_MAP(gelu_tanh_f32, 24) TEAM_MAP(erf_f32, 16) TEAM_MAP(exp_f32, 12)
    TEAM_MAP(tanh_f32, 16) TEAM_MAP(sigmoid_f32, 12) TEAM_MAP(silu_f32, 12) TEAM_MAP(log_f32, 12)
    TEAM_MAP(relu_f32, 2) TEAM_MAP(sqrt_f32, 4)
    TEAM_VV(add_f32_vv) TEAM_VV(subtract_f32_vv) TEAM_VV(multiply_f32_vv) TEAM_VV(divide_f32_vv)
#undef TEAM_MAP
#undef TEAM_VV
    case EMBER_KID_layer_norm_f32:
      if (run) {
        const i32 rows = a[4], m = a[5];
        i32 r0, r1;
        team_range(rows, 1, tid, team_width(ctl, nt, (i64)rows * m * 8), &r0, &r1);
        if (r0 < r1)
          layer_norm_f32(P_(const f32 *, 0) + r0 * m, P_(const f32 *, 1), P_(const f32 *, 2), P_(f32 *, 3) + r0 * m,
                         r1 - r0, m, ember_word_f32(a[6]));
      }
      return 0;
    default: return -1;
  }
}

/* Index of the last command >= start that splits (-1: none). */
static i32 last_split(const i32 *t, i32 start) {
  i32 at = HEADER, last = -1;
  for (i32 c = 0; c < t[2]; c++) {
    if (c >= start && team_dispatch(t[at], t + at + 3, 0, 0, 1, 0) >= 0) last = c;
    at += 3 + t[at + 1];
  }
  return last;
}

/* Thread tid's walk of a (checked) table: split kernels by every thread with a barrier after
 * each (and before one that follows commands of thread 0 alone), the rest by thread 0. A
 * guarded result that differs stops every thread (ctl[TEAM_STOP] = command + 1). */
#define STOPPED() (A_LOAD(&ctl[TEAM_STOP_RUN]) == run)
#define STOP_AT(c) (A_STORE(&ctl[TEAM_STOP], (c) + 1), A_STORE(&ctl[TEAM_STOP_RUN], run))

static void team_walk(const i32 *t, i32 start, i32 *ctl, i32 tid, i32 nt, i32 run) {
  const i32 last = last_split(t, start);
  i32 at = HEADER, pending = 0;
  for (i32 c = 0; c < t[2]; c++) {
    const i32 id = t[at], nargs = t[at + 1];
    const i32 *a = t + at + 3;
    if (c >= start) {
      if (tid && c > last) return;
      const i64 split = team_dispatch(id, a, ctl, tid, nt, 0);
      if (split >= 0) {
        if (pending) team_sync(ctl, tid, nt);
        if (STOPPED()) return;
        pending = 0;
        const i64 r = team_dispatch(id, a, ctl, tid, nt, 1);
        if (tid == 0 && (r >> 32) && (i32)r != t[at + 2]) STOP_AT(c);
        team_sync(ctl, tid, nt);
        if (STOPPED()) return;
      } else if (tid == 0) {
        pending = 1;
        const i64 r = ember_dispatch(id, a, nargs, 1);
        if ((r >> 32) && (i32)r != t[at + 2]) {
          STOP_AT(c);
          if (c < last) team_sync(ctl, tid, nt);   /* the others wait before the next split command */
          return;
        }
      } else {
        pending = 1;
      }
    }
    at += 3 + nargs;
  }
}

/* ember_run with the team of ctl: the workers that are ready, up to ctl[TEAM_THREADS] threads
 * in all, run the split kernels with the calling thread (thread 0). Same results as ember_run. */
EXPORT(ember_team_run) i32 ember_team_run(const i32 *t, i32 start, i32 *ctl) {
  const i32 bad = table_check(t);
  if (bad) return bad;
  i32 nt = 1;
  const i32 want = ctl[TEAM_THREADS] < TEAM_MAX ? ctl[TEAM_THREADS] : TEAM_MAX;
  while (nt < want && A_LOAD(&ctl[TEAM_READY + nt])) nt++;
  if (nt == 1 || last_split(t, start) < 0) return ember_run(t, start);
  A_STORE(&ctl[TEAM_TABLE], (i32)(__UINTPTR_TYPE__)t);
  A_STORE(&ctl[TEAM_START], start);
  A_ADD(&ctl[TEAM_RUNS], 1);
  /* generation and thread count in one word: a worker reads both at once */
  const i32 run = ((A_LOAD(&ctl[TEAM_RUN_GEN]) & ~0xFF) + 0x100) | nt;
  A_STORE(&ctl[TEAM_RUN_GEN], run);
  if (A_LOAD(&ctl[TEAM_IDLE])) __builtin_wasm_memory_atomic_notify(&ctl[TEAM_RUN_GEN], (u32)-1);
  team_walk(t, start, ctl, 0, nt, run);
  return STOPPED() ? A_LOAD(&ctl[TEAM_STOP]) : 0;
}

/* A worker's life (in a Web Worker / worker_threads, never a page's main thread): wait for a run,
 * take part when its index is below the run's thread count, until ctl[TEAM_QUIT]. */
EXPORT(ember_team_worker) void ember_team_worker(i32 *ctl, i32 tid) {
  i32 seen = A_LOAD(&ctl[TEAM_RUN_GEN]);
  A_STORE(&ctl[TEAM_READY + tid], 1);
  for (;;) {
    i32 spins = A_LOAD(&ctl[TEAM_SPIN]), g;
    while ((g = A_LOAD(&ctl[TEAM_RUN_GEN])) == seen) {
      if (A_LOAD(&ctl[TEAM_QUIT])) break;
      if (spins > 0) {
        spins--;
      } else {
        A_ADD(&ctl[TEAM_IDLE], 1);
        __builtin_wasm_memory_atomic_wait32(&ctl[TEAM_RUN_GEN], seen, -1);
        A_ADD(&ctl[TEAM_IDLE], -1);
      }
    }
    if (A_LOAD(&ctl[TEAM_QUIT])) break;
    seen = g;
    /* a run that needs this thread cannot end (nor the next start) before it reaches a barrier,
     * so the table and start read here belong to run g */
    if (tid < (g & 0xFF))
      team_walk((const i32 *)(__UINTPTR_TYPE__)(u32)A_LOAD(&ctl[TEAM_TABLE]), A_LOAD(&ctl[TEAM_START]), ctl, tid,
                g & 0xFF, g);
  }
  A_STORE(&ctl[TEAM_READY + tid], 0);
}
