/* <wasm_simd128.h> for a native build of the wasm backend's kernels (wasm/kernels/), used by
 * ember.native only (core/native/wasm_quant.c, wasm_gemm.c; see wasm_kernels.h there).
 *
 * SIMDe (https://github.com/simd-everywhere/simde, Debian's libsimde-dev, header-only) implements
 * every wasm_* SIMD128 intrinsic with the host's own vector instructions (SSE/AVX, NEON) or plain C,
 * with wasm's semantics (saturation, NaN propagation of min/max, nearest-even rounding); with
 * SIMDE_ENABLE_NATIVE_ALIASES the kernels' own wasm_* names resolve to it unchanged.
 *
 * The kernels compiled natively (quant.c, gemm.c) also reach team.h's wait/notify, two clang
 * builtins that exist only for wasm targets. Natively a kernel always runs with ctl == 0 (one thread
 * per call: numpy_blas.parallel_for splits the rows in Python), so the barrier never reaches them:
 * they become no-ops. (cast.c's saturating conversions have no stand-in: it is not compiled here.) */
#ifndef EMBER_NATIVE_WASM_SIMD128_H
#define EMBER_NATIVE_WASM_SIMD128_H
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/wasm/simd128.h>

#define __builtin_wasm_memory_atomic_notify(addr, count) ((void)0)
#define __builtin_wasm_memory_atomic_wait32(addr, expected, timeout) ((void)0)

#endif
