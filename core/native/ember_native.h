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

#endif
