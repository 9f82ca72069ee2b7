"""Shared by the Keras peers of weft's Cpu benches: Keras 3 on JAX on the CPU, and the timing and
JSON line every peer reports (the fastest of several timed runs after a warm-up, as weft's benches
report theirs)."""
import json
import os
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import keras  # noqa: E402


def emit(bench, size, value, unit):
    print(json.dumps({"peer": "keras-jax", "version": keras.__version__, "bench": bench, "size": size,
                      "value": round(value, 3), "unit": unit}), flush=True)


def measure(name, size, m, x, y, batch, x_infer):
    """Training steps/s of `m.fit` over `x, y` in batches of `batch`, and inference samples/s of
    `m.predict` over `x_infer`, reported as `{name}_train_step` and `{name}_infer`."""
    steps = len(x) // batch
    m.fit(x, y, batch_size=batch, epochs=1, verbose=0)
    best = float("inf")
    for _ in range(4):
        t = time.perf_counter()
        m.fit(x, y, batch_size=batch, epochs=1, verbose=0)
        best = min(best, (time.perf_counter() - t) / steps)
    emit(f"{name}_train_step", size, 1 / best, "steps/s")
    m.predict(x_infer, batch_size=batch, verbose=0)
    best = float("inf")
    for _ in range(8):
        t = time.perf_counter()
        m.predict(x_infer, batch_size=batch, verbose=0)
        best = min(best, time.perf_counter() - t)
    emit(f"{name}_infer", size, len(x_infer) / best, "samples/s")


def compiled(m):
    """`m` with Adam 1e-3 and softmax cross-entropy on logits, as weft's benches compile theirs."""
    m.compile(optimizer=keras.optimizers.Adam(1e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m
