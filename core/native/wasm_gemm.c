/* wasm/kernels/gemm.c compiled natively (see wasm_kernels.h): the float GEMM that quant.c's
 * f32/f16/bf16 path multiplies its expanded rows with. */
#ifdef EMBER_WASM_KERNELS
#include "wasm_kernels.h"
/* gemm.c's ROWS(RELU) guards only the first statement of RELU(r) by its `if (R > r)`: the other
 * half applies max(x, 0) to an accumulator that is never stored for that R (harmless; gcc warns) */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmultistatement-macros"
#endif
#include <gemm.c>
#endif
