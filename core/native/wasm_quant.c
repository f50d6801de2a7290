/* wasm/kernels/quant.c compiled natively (see wasm_kernels.h): qlinear, dequantize, qembedding of
 * every GGUF format the wasm backend knows, for core/backends/numpy_quant.py. */
#ifdef EMBER_WASM_KERNELS
#include "wasm_kernels.h"
#include <quant.c>
#endif
