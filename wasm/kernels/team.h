/* A team of threads running one command table on a shared memory (exec.c, wasm/team.py).
 *
 * Every instance of the module on the shared WebAssembly.Memory (the caller's thread plus one
 * per worker) walks the same table; a kernel that can split its work is called with (ctl, tid,
 * nt) and takes its share by thread index, the others run on thread 0 alone. `ctl` is the team's
 * control block in the shared memory (int32 words below); ctl == 0 means one thread, no team
 * (every exported kernel is its team version called that way, so the code is the same).
 *
 * Results never depend on the thread count: a kernel splits only along whole output elements
 * (rows, column panels, heads, batches), each computed by the same instructions in the same
 * order as with one thread. tests/test_wasm_threads.py checks it bit for bit with 1..4 threads.
 *
 * Thread 0 may be a page's main thread, where memory.atomic.wait traps: it only spins. Workers
 * spin a while, then wait (their idle time costs no CPU). */
#ifndef EMBER_TEAM_H
#define EMBER_TEAM_H
#include "ember.h"

enum {
  TEAM_RUN_GEN,     /* bumped by thread 0 to start a run (workers wait on it) */
  TEAM_TABLE,       /* the run: table address, first command, thread count */
  TEAM_START,
  TEAM_NT,
  TEAM_BAR_COUNT,   /* barrier: arrivals, generation, sleeping waiters */
  TEAM_BAR_GEN,
  TEAM_WAITERS,
  TEAM_STOP,        /* command index + 1 where a guarded result differed (all threads stop) */
  TEAM_QUIT,        /* workers return from ember_team_worker */
  TEAM_SCRATCH,     /* per-thread scratch: thread t's at SCRATCH + t * SCRATCH_STRIDE (bytes) */
  TEAM_SCRATCH_STRIDE,
  TEAM_MIN_WORK,    /* a kernel splits only work of at least MIN_WORK units per thread */
  TEAM_THREADS,     /* threads asked for (set_threads) */
  TEAM_SPIN,        /* spins before a worker sleeps */
  TEAM_RUNS,        /* runs started (statistics) */
  TEAM_IDLE,        /* workers asleep between runs */
  TEAM_MAIN_WAIT,   /* thread 0 may sleep in barriers too (not a page's main thread) */
  TEAM_STOP_RUN,    /* the run (its RUN_GEN word) that TEAM_STOP belongs to: never reset, so a
                       worker late out of a stopped run's barrier cannot miss the stop */
  TEAM_BARRIERS,    /* barriers between a table's commands that thread 0 met (statistics) */
  TEAM_READY = 24,  /* READY + t: worker t entered ember_team_worker */
  TEAM_MAX = 64,
  TEAM_WORDS = TEAM_READY + TEAM_MAX
};

#define A_LOAD(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define A_STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
#define A_ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_SEQ_CST)

/* All nt threads meet here; what any wrote before is visible to all after. */
static void team_sync(i32 *ctl, i32 tid, i32 nt) {
  if (!ctl || nt <= 1) return;
  const i32 gen = A_LOAD(&ctl[TEAM_BAR_GEN]);
  if (A_ADD(&ctl[TEAM_BAR_COUNT], 1) == nt - 1) {
    A_STORE(&ctl[TEAM_BAR_COUNT], 0);
    A_ADD(&ctl[TEAM_BAR_GEN], 1);
    if (A_LOAD(&ctl[TEAM_WAITERS])) __builtin_wasm_memory_atomic_notify(&ctl[TEAM_BAR_GEN], (u32)-1);
    return;
  }
  i32 spins = tid || ctl[TEAM_MAIN_WAIT] ? A_LOAD(&ctl[TEAM_SPIN]) : -1;
  while (A_LOAD(&ctl[TEAM_BAR_GEN]) == gen) {
    if (spins > 0) spins--;
    else if (spins == 0) {
      A_ADD(&ctl[TEAM_WAITERS], 1);
      __builtin_wasm_memory_atomic_wait32(&ctl[TEAM_BAR_GEN], gen, -1);
      A_ADD(&ctl[TEAM_WAITERS], -1);
    }
  }
}

/* How many of the nt threads share `work` units (at least MIN_WORK each): 1 without a team. */
INLINE i32 team_width(const i32 *ctl, i32 nt, i64 work) {
  if (!ctl || nt <= 1) return 1;
  const i64 per = ctl[TEAM_MIN_WORK] > 0 ? ctl[TEAM_MIN_WORK] : 1;
  const i64 w = work / per;
  return w < 1 ? 1 : w < nt ? (i32)w : nt;
}

/* Thread tid's share [*lo, *hi) of n items cut in grains of `grain` (the last grain may be
 * short), among `width` threads (tid >= width: empty). */
INLINE void team_range(i32 n, i32 grain, i32 tid, i32 width, i32 *lo, i32 *hi) {
  if (tid >= width) { *lo = *hi = 0; return; }
  const i32 g = (n + grain - 1) / grain;
  i32 a = (i32)((i64)g * tid / width) * grain, b = (i32)((i64)g * (tid + 1) / width) * grain;
  *lo = a < n ? a : n;
  *hi = b < n ? b : n;
}

/* Thread tid's private scratch, or `own` (the kernel's own scratch) without a team. */
INLINE void *team_scratch(const i32 *ctl, i32 tid, void *own) {
  if (!ctl) return own;
  return (void *)(__UINTPTR_TYPE__)((u32)ctl[TEAM_SCRATCH] + (u32)tid * (u32)ctl[TEAM_SCRATCH_STRIDE]);
}

/* The team versions of the kernels that split (exec.c dispatches to them). */
void gemm_team(const f32 *A, const f32 *B, f32 *S, f32 *C, const f32 *bias, const i32 *prm, i32 *ctl, i32 tid,
               i32 nt);
i32 q_linear_team(const void *wv, const f32 *x, f32 *y, f32 *scratch, const i32 *prm, i32 *ctl, i32 tid, i32 nt);
i32 q_linear_width(const i32 *prm, const i32 *ctl, i32 nt);
i64 q_linear_extent(const i32 *prm, i32 scratch);
void sdpa_f32_team(const f32 *q, const f32 *k, const f32 *v, const void *mask, f32 *out, f32 *scratch,
                   const i32 *prm, f32 scale, i32 *ctl, i32 tid, i32 nt);
void conv2d_gemm_team(const f32 *x, const f32 *wt, const f32 *bias, f32 *y, f32 *scratch, const i32 *prm,
                      i32 *ctl, i32 tid, i32 nt);
i32 attention_cached_f32_team(const f32 *q, const f32 *k, const f32 *v, f32 *kc, f32 *vc, const i32 *pos,
                              f32 *out, f32 *scratch, const i32 *prm, f32 scale, i32 *ctl, i32 tid, i32 nt);

/* strided copies (copy.c): rows of the output, a row being the innermost axis */
INLINE i32 copy_rows(const i32 *sh) { return sh[0] * sh[1] * sh[2] * sh[3] * sh[4]; }
i32 copy_width(const void *src, const void *dst, const i32 *sh, const i32 *st, i32 size, const i32 *ctl, i32 nt);
void copy_strided_x8_rows(const unsigned char *src, unsigned char *dst, const i32 *sh, const i32 *st, i32 r0, i32 r1);
void copy_strided_x32_rows(const u32 *src, u32 *dst, const i32 *sh, const i32 *st, i32 r0, i32 r1);
void copy_strided_x64_rows(const i64 *src, i64 *dst, const i32 *sh, const i32 *st, i32 r0, i32 r1);

#endif
