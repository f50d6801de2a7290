/* wasm/kernels/llm.c compiled natively (see wasm_kernels.h): rms_norm, rope and attention over a
 * key/value cache for core/backends/numpy_llm.py (float64 rms_norm and rope as the python
 * specification; attention in float32 with mathf.h's exp). */
#ifdef EMBER_WASM_KERNELS
#include "wasm_kernels.h"
#include <llm.c>
#endif
