#!/usr/bin/env python3
"""Token ids from the `tokenizers` package for texts that exercise every part of BERT's
tokenizer (accents, CJK, punctuation, special tokens, unknown words, control characters).

    python3 scripts/tokens_reference.py MODEL_DIR OUT.json
"""

import json
import sys

from tokenizers import Tokenizer

TEXTS = [
    "A man is eating food.",
    "Café naïve résumé, déjà vu — ÉCOLE!",
    "我喜欢机器学习 and 深度学习",
    "Hello,world!!! ¿Qué tal? (yes) [no] {maybe} \"quoted\" 'single'",
    "don't won't it's 3.14 1,000,000 e-mail co-operate",
    "The [MASK] sat on the [SEP] mat [CLS]",
    "tabs\tand\nnewlines\r\nand  double  spaces",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "emoji 🙂 and symbols © ® ™ € £ ¥ ∑ ∞",
    "zero\u200bwidth and control\u0007char",
    "x" * 120,
    "",
]

tok = Tokenizer.from_file(f"{sys.argv[1]}/tokenizer.json")
tok.no_padding()
tok.no_truncation()
out = {"texts": TEXTS, "ids": [tok.encode(t).ids for t in TEXTS]}
with open(sys.argv[2], "w") as f:
    json.dump(out, f, ensure_ascii=False)
    f.write("\n")
