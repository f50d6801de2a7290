/* The wasm backend's kernels compiled natively: quantized weights (wasm_quant.c, wasm_gemm.c here)
 * and the language-model ops (wasm_llm.c).
 *
 * wasm/kernels/quant.c (and gemm.c, whose float GEMM quant.c uses for f32/f16/bf16 weights) are
 * written with wasm SIMD128 intrinsics; SIMDe emulates those with this CPU's vector instructions
 * (wasm_shim/wasm_simd128.h), so the same sources give the same integer sums and the same float
 * operations in the same order as in the page (bit-equal where SIMDe maps an intrinsic exactly).
 * __init__.py compiles these files only when SIMDe's header is found (-DEMBER_WASM_KERNELS, with
 * wasm_shim/ and wasm/kernels/ on the include path); without it they are empty.
 *
 * Every function those sources define outside `static` is renamed here with the prefix
 * ember_wasm_ (the same in every file, so quant.c's calls reach gemm.c's definitions), so that no
 * name from wasm/kernels can clash with a kernel of this folder. EXPORT (ember.h) gives the entry
 * points default visibility natively; Python calls ember_wasm_q_linear, _q_dequantize, _q_embedding
 * (numpy_quant.py) and ember_wasm_rms_norm_f32, _rope_f32, _attention_cached_f32 (numpy_llm.py).
 * A new non-static function in quant.c, gemm.c or llm.c needs a line here (else a clash is a link
 * error, and tests/test_native_quant.py, test_native_llm.py check the exported names). */
#ifndef EMBER_NATIVE_WASM_KERNELS_H
#define EMBER_NATIVE_WASM_KERNELS_H

/* quant.c */
#define q_dequantize ember_wasm_q_dequantize
#define q_embedding ember_wasm_q_embedding
#define q_linear ember_wasm_q_linear
#define q_linear_team ember_wasm_q_linear_team
#define q_linear_width ember_wasm_q_linear_width
#define q_linear_extent ember_wasm_q_linear_extent
/* gemm.c */
#define gemm ember_wasm_gemm
#define gemm_team ember_wasm_gemm_team
#define gemm_pack_rows ember_wasm_gemm_pack_rows
#define gemm_pack_cols ember_wasm_gemm_pack_cols
#define gemm_packed_one ember_wasm_gemm_packed_one
#define gemm_direct_one ember_wasm_gemm_direct_one
#define gemm_dot_one ember_wasm_gemm_dot_one
/* llm.c */
#define rms_norm_f32 ember_wasm_rms_norm_f32
#define rope_f32 ember_wasm_rope_f32
#define attention_cached_f32 ember_wasm_attention_cached_f32
#define attention_cached_f32_team ember_wasm_attention_cached_f32_team

#endif
