/* ember's native CPU kernels: shared definitions (see __init__.py for how they are built and called).
 *
 * Rules every kernel follows:
 *  - plain C11 compiled on the user's machine (-O3 -march=native), no Python headers: Python calls
 *    a kernel through ctypes, which releases the GIL for the call, so two threads (numpy_blas's
 *    parallel_for) may run two kernels, or two ranges of one kernel, at once;
 *  - a kernel writes only to the output pointers it is given, within the extents Python checked;
 *    no globals, no allocation, no I/O: every buffer comes from numpy;
 *  - float32 math in the order the kernel's comment states (results are the same bits on any
 *    number of threads: ranges split outputs, never a sum);
 *  - lengths and strides are int64 in elements.
 */
#ifndef EMBER_NATIVE_H
#define EMBER_NATIVE_H
#include <stdint.h>
#include <stddef.h>

#define EXPORT __attribute__((visibility("default")))
#define INLINE static inline __attribute__((always_inline))

typedef float f32;
typedef int64_t i64;
typedef int32_t i32;

/* shared between files (not exported): rows.c's layer norm over rows ldx / ldy apart */
void ember_layer_norm_rows(i64 rows, i64 n, const f32 *x, i64 ldx, const f32 *w, const f32 *b, f32 eps, f32 *y,
                           i64 ldy);
/* rows.c's softmax over rows ldx / ldy apart */
void ember_softmax_rows(i64 rows, i64 n, const f32 *x, i64 ldx, f32 *y, i64 ldy);
/* dense.c's matrix-vector product and activation pass (exported too) */
EXPORT i64 ember_gemv(const f32 *w, const f32 *x, const f32 *bias, f32 *y, const i64 *g, const f32 *ap, i64 o0,
                      i64 o1);
EXPORT i64 ember_activation(f32 *y, i64 n, i64 act, const f32 *ap);
/* qdot.c's quantized matrix-vector products (q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q6_k; AVX-512 / AVX2): numpy_quant.py */
EXPORT i64 ember_qdot_isa(void);
EXPORT i64 ember_qdot_scratch_bytes(i64 m, i64 k);
EXPORT i64 ember_qdot_linear(const void *w, const f32 *x, f32 *y, i64 ldy, void *scratch, i64 qtype, i64 m, i64 n,
                             i64 k);

#endif
