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

EXPORT(ember_run) i32 ember_run(const i32 *t, i32 start) {
  if (t[0] != TABLE_MAGIC || t[1] != (i32)EMBER_ABI) return -1;
  const i32 n = t[2], words = t[3];
  /* the whole table is checked before its first command runs */
  i32 at = HEADER;
  for (i32 c = 0; c < n; c++) {
    if (at > words - 3) return -2 - c;
    const i32 nargs = t[at + 1];
    if (nargs < 0 || nargs > words - at - 3) return -2 - c;
    if (ember_dispatch(t[at], t + at + 3, nargs, 0) < 0) return -2 - c;
    at += 3 + nargs;
  }
  if (at != words) return -2 - n;
  at = HEADER;
  for (i32 c = 0; c < n; c++) {
    const i32 nargs = t[at + 1];
    if (c >= start) {
      const i64 r = ember_dispatch(t[at], t + at + 3, nargs, 1);
      if ((r >> 32) && (i32)r != t[at + 2]) return c + 1;
    }
    at += 3 + nargs;
  }
  return 0;
}
