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

typedef unsigned long long u64;

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
    /* strided copies: ranges of output rows (where source and destination do not overlap) */
#define TEAM_COPY(NAME, T, SIZE)                                                                \
    case EMBER_KID_##NAME:                                                                      \
      if (run) {                                                                                \
        i32 lo, hi;                                                                             \
        team_range(copy_rows(P_(const i32 *, 2)), 1, tid,                                       \
                   copy_width(P_(const void *, 0), P_(const void *, 1), P_(const i32 *, 2), P_(const i32 *, 3), \
                              SIZE, ctl, nt), &lo, &hi);                                        \
        if (lo < hi) NAME##_rows(P_(const T *, 0), P_(T *, 1), P_(const i32 *, 2), P_(const i32 *, 3), lo, hi); \
      }                                                                                         \
      return 0;
    TEAM_COPY(copy_strided_x8, unsigned char, 1) TEAM_COPY(copy_strided_x32, u32, 4)
    TEAM_COPY(copy_strided_x64, i64, 8)
#undef TEAM_COPY
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

/* ---- barriers: only where a command may touch what another thread did since the last one ------
 *
 * A command "splits" when its team version would use more than one thread (team_width: tiny
 * maps, residual adds and products run on thread 0 alone, with the same instructions as ember_run).
 * Every thread walks the whole table and takes the same decisions, from the table and ctl alone.
 * A barrier is owed after a split command (the others' shares) and after thread 0's commands
 * before a split one; it is skipped when the next command's memory is known and touches none of
 * what the commands since the last barrier wrote (nor writes what they read): the Q, K and V
 * products, gate and up meet at one barrier. Kernels whose memory this file cannot name
 * (everything but q_linear, the elementwise maps and the same-shape binary ops) always meet. */

static i32 cmd_width(i32 id, const i32 *a, const i32 *ctl, i32 nt) {
  switch (id) {
    case EMBER_KID_gemm: case EMBER_KID_conv2d_gemm: case EMBER_KID_sdpa_f32: case EMBER_KID_attention_cached_f32:
      return nt;
    case EMBER_KID_q_linear: return q_linear_width(P_(const i32 *, 4), ctl, nt);
/* (the empty asm keeps clang from turning the costs into a lookup table: the module has no data) */
#define W_MAP(NAME, COST) \
    case EMBER_KID_##NAME: { i32 c_ = COST; __asm__("" : "+r"(c_)); return team_width(ctl, nt, (i64)a[2] * c_); }
#define W_VV(NAME) case EMBER_KID_##NAME: return team_width(ctl, nt, (i64)a[3] * 2);
    W_MAP(gelu_f32, 24) W_MAP(gelu_tanh_f32, 24) W_MAP(erf_f32, 16) W_MAP(exp_f32, 12)
    W_MAP(tanh_f32, 16) W_MAP(sigmoid_f32, 12) W_MAP(silu_f32, 12) W_MAP(log_f32, 12)
    W_MAP(relu_f32, 2) W_MAP(sqrt_f32, 4)
    W_VV(add_f32_vv) W_VV(subtract_f32_vv) W_VV(multiply_f32_vv) W_VV(divide_f32_vv)
#undef W_MAP
#undef W_VV
    case EMBER_KID_layer_norm_f32: return team_width(ctl, nt, (i64)a[4] * a[5] * 8);
#define W_COPY(NAME, SIZE) \
    case EMBER_KID_##NAME: { i32 s_ = SIZE; __asm__("" : "+r"(s_)); \
      return copy_width(P_(const void *, 0), P_(const void *, 1), P_(const i32 *, 2), P_(const i32 *, 3), s_, ctl, nt); }
    W_COPY(copy_strided_x8, 1) W_COPY(copy_strided_x32, 4) W_COPY(copy_strided_x64, 8)
#undef W_COPY
    default: return 0;   /* thread 0's */
  }
}

/* A byte span [lo, hi) packed as lo | hi << 32 (0: none). No arrays or structs: the module has no
 * stack, so these stay scalars. */
INLINE u64 span_of(i32 p, i64 n) {
  const u64 lo = (u32)p, hi = lo + (u64)n;
  return n <= 0 ? 0 : lo | (hi > 0xFFFFFFFFull ? 0xFFFFFFFFull : hi) << 32;
}

/* Span k of the memory command (id, a) touches on `width` threads: k = 0..2 what it reads, 3..4
 * what it writes (0: none); k = -1 answers whether they are known (1) or not (0). */
static u64 cmd_span(i32 id, const i32 *a, i32 width, i32 k) {
  switch (id) {
    case EMBER_KID_q_linear: {
      const i32 *prm = P_(const i32 *, 4);
      const i64 wb = q_linear_extent(prm, 0);
      if (k < 0) return wb >= 0;
      const i64 M = prm[1], N = prm[2], K = prm[3];
      switch (k) {
        case 0: return span_of(a[0], wb);
        case 1: return span_of(a[1], 4 * M * K);
        case 2: return span_of(a[4], 16);
        case 3: return span_of(a[2], 4 * M * N);
        case 4: return width <= 1 ? span_of(a[3], q_linear_extent(prm, 1)) : 0;   /* its own scratch */
        default: return 0;
      }
    }
#define S_MAP(NAME) case EMBER_KID_##NAME:
    S_MAP(gelu_f32) S_MAP(gelu_tanh_f32) S_MAP(erf_f32) S_MAP(exp_f32) S_MAP(tanh_f32) S_MAP(sigmoid_f32)
    S_MAP(silu_f32) S_MAP(log_f32) S_MAP(relu_f32) S_MAP(sqrt_f32)
      if (k < 0) return a[2] >= 0;
      return k == 0 ? span_of(a[0], 4 * (i64)a[2]) : k == 3 ? span_of(a[1], 4 * (i64)a[2]) : 0;
    S_MAP(add_f32_vv) S_MAP(subtract_f32_vv) S_MAP(multiply_f32_vv) S_MAP(divide_f32_vv)
      if (k < 0) return a[3] >= 0;
      return k == 0 ? span_of(a[0], 4 * (i64)a[3]) : k == 1 ? span_of(a[1], 4 * (i64)a[3])
           : k == 3 ? span_of(a[2], 4 * (i64)a[3]) : 0;
#undef S_MAP
    default: return 0;
  }
}

INLINE i32 overlap(u64 x, u64 y) {
  return x && y && (u32)x < (u32)(y >> 32) && (u32)y < (u32)(x >> 32);
}

/* 1 when the memory of command (id, a) on w threads is known and it writes none of what it reads
 * (an in-place command would not give the same result twice: a stopped run's commands that ran
 * past the stop, below, are run again when Python resumes the table) */
static i32 cmd_known(i32 id, const i32 *a, i32 w) {
  if (!cmd_span(id, a, w, -1)) return 0;
  for (i32 k = 3; k < 5; k++) {
    const u64 x = cmd_span(id, a, w, k);
    for (i32 j = 0; j < 3; j++) if (overlap(x, cmd_span(id, a, w, j))) return 0;
  }
  return 1;
}

#define INDEPENDENT_MAX 16   /* commands since the last barrier that a check looks back over */

/* 1 when command (id, a) of width w needs no barrier after the commands from word `from` (the
 * first after the last barrier) up to word `upto`: every one of them and it have known memory,
 * and it writes nothing they touched and reads nothing they wrote. */
static i32 independent(const i32 *t, i32 from, i32 upto, i32 id, const i32 *a, i32 w, const i32 *ctl, i32 nt) {
  if (!cmd_known(id, a, w)) return 0;
  i32 n = 0;
  for (i32 at = from; at < upto; at += 3 + t[at + 1]) {
    const i32 jd = t[at], *b = t + at + 3, wj = cmd_width(jd, b, ctl, nt);
    if (++n > INDEPENDENT_MAX || !cmd_known(jd, b, wj)) return 0;
    for (i32 k = 3; k < 5; k++) {
      const u64 x = cmd_span(id, a, w, k);
      for (i32 j = 0; j < 5; j++) if (overlap(x, cmd_span(jd, b, wj, j))) return 0;
    }
    for (i32 k = 0; k < 3; k++) {
      const u64 x = cmd_span(id, a, w, k);
      for (i32 j = 3; j < 5; j++) if (overlap(x, cmd_span(jd, b, wj, j))) return 0;
    }
  }
  return 1;
}

/* Index of the last command >= start that splits (-1: none). */
static i32 last_split(const i32 *t, i32 start, const i32 *ctl, i32 nt) {
  i32 at = HEADER, last = -1;
  for (i32 c = 0; c < t[2]; c++) {
    if (c >= start && cmd_width(t[at], t + at + 3, ctl, nt) > 1) last = c;
    at += 3 + t[at + 1];
  }
  return last;
}

/* Thread tid's walk of a (checked) table: split commands by every thread, the rest by thread 0,
 * barriers as above. A guarded result that differs stops every thread at the next barrier
 * (ctl[TEAM_STOP] = command + 1); thread 0 runs nothing more meanwhile. */
#define STOPPED() (A_LOAD(&ctl[TEAM_STOP_RUN]) == run)
#define STOP_AT(c) (A_STORE(&ctl[TEAM_STOP], (c) + 1), A_STORE(&ctl[TEAM_STOP_RUN], run))

static void team_walk(const i32 *t, i32 start, i32 *ctl, i32 tid, i32 nt, i32 run) {
  const i32 last = last_split(t, start, ctl, nt);
  i32 at = HEADER, from = HEADER, owed = 0, pending = 0, dry = 0;   /* from: the first command after
                                         the last barrier; owed: split work since; pending: thread 0's */
  for (i32 c = 0; c < t[2]; c++) {
    const i32 id = t[at], nargs = t[at + 1], here = at;
    const i32 *a = t + at + 3;
    at += 3 + nargs;
    if (c < start) {
      from = at;
      continue;
    }
    if (tid && c > last && !owed) return;
    const i32 width = cmd_width(id, a, ctl, nt), split = width > 1;
    if ((split ? owed || pending : owed) && !independent(t, from, here, id, a, width, ctl, nt)) {
      if (!tid) A_ADD(&ctl[TEAM_BARRIERS], 1);
      team_sync(ctl, tid, nt);
      if (STOPPED()) return;
      owed = pending = 0;
      from = here;
    }
    /* after a stop, split commands before the next barrier still run on every thread (their
     * memory is known, they are not in place and touch nothing the stopped one wrote: running
     * them again when Python resumes gives the same bits; the kernels of unknown memory, some
     * with barriers inside, never come before the barrier) */
    if (split) {
      owed = 1;
      const i64 res = team_dispatch(id, a, ctl, tid, nt, 1);
      if (tid == 0 && !dry && (res >> 32) && (i32)res != t[here + 2]) STOP_AT(c), dry = 1;
    } else {
      pending = 1;
      if (tid == 0 && !dry) {
        const i64 res = ember_dispatch(id, a, nargs, 1);
        if ((res >> 32) && (i32)res != t[here + 2]) STOP_AT(c), dry = 1;
      }
    }
    if (dry && !owed && c >= last) return;   /* thread 0 stopped and no barrier is left to meet */
  }
  if (owed) {
    if (!tid) A_ADD(&ctl[TEAM_BARRIERS], 1);
    team_sync(ctl, tid, nt);
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
  if (nt == 1 || last_split(t, start, ctl, nt) < 0) return ember_run(t, start);
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
