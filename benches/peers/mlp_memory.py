#!/usr/bin/env python3
"""Peer for `cargo bench --bench train_memory`: resident memory of the same MLP training in
Keras 3 on JAX (CPU): 784-1024-1024-10, ReLU, softmax cross-entropy, Adam, batch 256, 20
batches of random data an epoch, through model.fit; the process's resident set after 100 and
after 1,000 steps, and its peak (Linux' VmRSS and VmHWM). Prints one JSON line per figure.

    python3 benches/peers/mlp_memory.py
"""

import json
import os

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402
import keras  # noqa: E402

B, BATCHES = 256, 20


def status_mib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) / 1024.0
    return None


def emit(bench, value):
    print(json.dumps({"peer": "keras-jax", "bench": bench, "size": "mlp784-1024-1024-10/b256",
                      "value": round(value, 3), "unit": "MiB", "keras": keras.__version__}), flush=True)


def main():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((784,)),
        keras.layers.Dense(1024, activation="relu"),
        keras.layers.Dense(1024, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.random((B * BATCHES, 784), dtype=np.float32)
    y = (np.arange(B * BATCHES) * 7 % 10).astype(np.int32)
    model.fit(x, y, batch_size=B, epochs=5, shuffle=False, verbose=0)  # 100 steps
    early = status_mib("VmRSS:")
    model.fit(x, y, batch_size=B, epochs=45, shuffle=False, verbose=0)  # 900 more
    emit("train_rss_100_steps", early)
    emit("train_rss_1000_steps", status_mib("VmRSS:"))
    emit("train_peak_rss", status_mib("VmHWM:"))


if __name__ == "__main__":
    main()
