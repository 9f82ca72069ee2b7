#!/usr/bin/env python3
"""Peer for `cargo bench --bench minilm`: all-MiniLM-L6-v2 sentence embeddings on onnxruntime
(fp32, Cpu), the same work as weft's bench (8 sequences of 32 tokens, padding masked, mean
pooling and L2 normalisation), with the same thread count.

The ONNX graph is built here, op by op, from the model's own safetensors file (nothing is
downloaded but the pip packages), so both sides run the same weights. onnxruntime then applies
its own graph fusions (attention, GELU, skip-layer-norm), as a user running an exported model
would get. Before timing, the embeddings are checked against weft's numpy reference encoder
(scripts/minilm_reference.py) on the same ids.

    pip install onnx onnxruntime numpy
    bash scripts/fetch_minilm.sh        # prints the model folder
    python3 benches/peers/minilm_ort.py target/models/all-MiniLM-L6-v2 [THREADS]

Prints one JSON line per figure, as the Rust benches do.
"""

import json
import os
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
from minilm_reference import encode, read_safetensors  # noqa: E402

LAYERS, HEADS, WIDTH = 6, 12, 384


class Graph:
    """A tiny builder: each call adds one node and returns its output's name."""

    def __init__(self):
        self.nodes, self.inits, self.n = [], [], 0

    def const(self, name, value, dtype=np.float32):
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, kind, inputs, **attrs):
        self.n += 1
        out = f"{kind.lower()}_{self.n}"
        self.nodes.append(helper.make_node(kind, inputs, [out], **attrs))
        return out


def build(w):
    pre = "" if "embeddings.word_embeddings.weight" in w else "bert."
    g = Graph()
    f32 = lambda name, key: g.const(name, w[pre + key].astype(np.float32))  # noqa: E731
    shape = lambda name, dims: g.const(name, dims, np.int64)  # noqa: E731
    ids, mask, types = "input_ids", "attention_mask", "token_type_ids"
    # Embeddings: word + position (0..t) + token type, then LayerNorm.
    t = g.op("Gather", [g.op("Shape", [ids]), g.const("one_i", 1, np.int64)], axis=0)
    pos = g.op("Range", [g.const("zero_i", 0, np.int64), t, g.const("step_i", 1, np.int64)])
    h = g.op("Gather", [f32("word", "embeddings.word_embeddings.weight"), ids])
    h = g.op("Add", [h, g.op("Gather", [f32("position", "embeddings.position_embeddings.weight"), pos])])
    h = g.op("Add", [h, g.op("Gather", [f32("type", "embeddings.token_type_embeddings.weight"), types])])

    def norm(x, key):
        return g.op(
            "LayerNormalization", [x, f32(key + ".w", key + ".weight"), f32(key + ".b", key + ".bias")],
            axis=-1, epsilon=1e-12,
        )

    h = norm(h, "embeddings.LayerNorm")
    # Padding keys get a large negative score: [b, 1, 1, t].
    keep = g.op("Cast", [g.op("Unsqueeze", [mask, shape("axes12", [1, 2])])], to=TensorProto.FLOAT)
    bias = g.op("Mul", [g.op("Sub", [g.const("one_f", 1.0), keep]), g.const("neg", -1e4)])
    heads = shape("heads", [0, -1, HEADS, WIDTH // HEADS])
    flat = shape("flat", [0, -1, WIDTH])
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."

        def lin(x, name):
            k = g.const(p + name + ".wT", w[pre + p + name + ".weight"].T.astype(np.float32))
            return g.op("Add", [g.op("MatMul", [x, k]), f32(p + name + ".b", p + name + ".bias")])

        def split(x):
            return g.op("Transpose", [g.op("Reshape", [x, heads])], perm=[0, 2, 1, 3])

        q, k, v = (split(lin(h, f"attention.self.{n}")) for n in ("query", "key", "value"))
        s = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])])
        s = g.op("Add", [g.op("Div", [s, g.const(f"scale{i}", np.sqrt(WIDTH // HEADS))]), bias])
        a = g.op("MatMul", [g.op("Softmax", [s], axis=-1), v])
        a = g.op("Reshape", [g.op("Transpose", [a], perm=[0, 2, 1, 3]), flat])
        h = norm(g.op("Add", [lin(a, "attention.output.dense"), h]), p + "attention.output.LayerNorm")
        m = lin(h, "intermediate.dense")
        erf = g.op("Erf", [g.op("Div", [m, g.const(f"sqrt2_{i}", np.sqrt(2.0))])])
        m = g.op("Mul", [g.op("Mul", [m, g.op("Add", [erf, g.const(f"one{i}", 1.0)])]), g.const(f"half{i}", 0.5)])
        h = norm(g.op("Add", [lin(m, "output.dense"), h]), p + "output.LayerNorm")
    # Mean over the real tokens, then L2 normalisation.
    km = g.op("Cast", [g.op("Unsqueeze", [mask, shape("axis2", [2])])], to=TensorProto.FLOAT)
    summed = g.op("ReduceSum", [g.op("Mul", [h, km]), shape("axis1", [1])], keepdims=0)
    count = g.op("Max", [g.op("ReduceSum", [km, shape("axis1b", [1])], keepdims=0), g.const("tiny", 1e-9)])
    pooled = g.op("Div", [summed, count])
    norm2 = g.op("Max", [g.op("ReduceL2", [pooled], axes=[-1], keepdims=1), g.const("tiny2", 1e-12)])
    g.nodes.append(helper.make_node("Div", [pooled, norm2], ["embeddings"]))
    i64 = lambda n: helper.make_tensor_value_info(n, TensorProto.INT64, ["b", "t"])  # noqa: E731
    graph = helper.make_graph(
        g.nodes, "minilm", [i64(ids), i64(mask), i64(types)],
        [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["b", WIDTH])], g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main():
    model_dir = sys.argv[1]
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    w = read_safetensors(f"{model_dir}/model.safetensors")
    model = build(w)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    # The bench's inputs (WEFT_MINILM_SHAPE, as the bench reads it: default 8 sequences of 32
    # tokens): sequence j keeps t - (3 j mod (2t/3 + 1)) real tokens (32 down to 11 for 8 x 32),
    # the rest padding.
    shape = os.environ.get("WEFT_MINILM_SHAPE", "8x32")
    try:
        b, t = (int(v) for v in shape.split("x"))
    except ValueError:
        sys.exit(f"WEFT_MINILM_SHAPE={shape!r}: want BATCHxTOKENS")
    if b < 1 or not 1 <= t <= 512:
        sys.exit(f"WEFT_MINILM_SHAPE={shape!r}: want BATCHxTOKENS, each at least 1, tokens at most 512")
    i = np.arange(b * t)
    ids = ((i * 7919 % 30000) + 100).reshape(b, t).astype(np.int64)
    mask = (i % t < t - (3 * (i // t)) % (2 * t // 3 + 1)).reshape(b, t).astype(np.int64)
    types = np.zeros((b, t), np.int64)
    feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    got = sess.run(None, feed)[0]
    want = encode(w, ids, mask, types)
    err = float(np.abs(got - want).max())
    if err > 1e-4:
        sys.exit(f"onnxruntime's embeddings differ from the numpy reference by {err}")
    # Warm up for at least 3 calls and 1 s, then the median of 5 blocks of at least 0.4 s.
    start, calls = time.perf_counter(), 0
    while calls < 3 or time.perf_counter() - start < 1.0:
        sess.run(None, feed)
        calls += 1
    per = (time.perf_counter() - start) / calls
    block = max(1, int(0.4 / per))
    times = []
    for _ in range(5):
        s = time.perf_counter()
        for _ in range(block):
            sess.run(None, feed)
        times.append((time.perf_counter() - s) / block)
    ms = float(np.median(times)) * 1e3
    print(json.dumps({"bench": "minilm_forward", "peer": "onnxruntime", "version": ort.__version__,
                      "threads": threads, "shape": f"b{b}xt{t}", "value": round(ms, 3), "unit": "ms",
                      "max_abs_diff_vs_reference": err}))


if __name__ == "__main__":
    main()
