/* ember's WebAssembly SIMD kernels: shared definitions.
 *
 * Rules every kernel follows (the build and tests/test_wasm_module.py check them):
 *  - no libc, no data, no globals, no linear-memory stack: only locals (registers) and the
 *    buffers Python hands in. The module runs on Pyodide's own memory, where any address it
 *    picked for itself would belong to Python objects. Large local arrays would spill to a
 *    stack: don't write them (the build strips __stack_pointer, so such code fails to link).
 *  - a kernel writes only to the output/scratch pointers it is given, and only within the
 *    element counts Python checked (see ember/wasm/runtime.py).
 *  - float32 math; integers are int32 (lengths, strides) in element units.
 */
#ifndef EMBER_H
#define EMBER_H
#include <wasm_simd128.h>

#ifdef __wasm__
#define EXPORT(name) __attribute__((export_name(#name)))
#else   /* compiled natively through SIMDe (ember.native, core/native/wasm_kernels.h): a visible symbol */
#define EXPORT(name) __attribute__((visibility("default")))
#endif
#define INLINE static inline __attribute__((always_inline))

typedef float f32;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef v128_t f32x4;

#endif
