"""The CIFAR-sized CNN of `cargo bench --bench conv` (cifar_cnn_*) in Keras 3 on JAX, on the CPU:
32x32x3 inputs, Conv2D 32-32 (3x3 same, ReLU), MaxPooling 2, Conv2D 64-64, MaxPooling 2, Flatten,
Dense 128 ReLU, Dense 10; softmax cross-entropy on logits, Adam 1e-3, batch 64, random data.
Prints one JSON line each for training steps/s (model.fit) and inference samples/s (predict),
the fastest of several timed runs after a warm-up, as the weft bench reports its figures."""
import json
import os
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import keras  # noqa: E402
import numpy as np  # noqa: E402

B, STEPS = 64, 20


def model():
    L = keras.layers
    conv = lambda f: L.Conv2D(f, 3, padding="same", activation="relu")  # noqa: E731
    m = keras.Sequential([keras.Input((32, 32, 3)), conv(32), conv(32), L.MaxPooling2D(2), conv(64), conv(64),
                          L.MaxPooling2D(2), L.Flatten(), L.Dense(128, activation="relu"), L.Dense(10)])
    m.compile(optimizer=keras.optimizers.Adam(1e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


def emit(bench, value, unit):
    print(json.dumps({"peer": "keras-jax", "version": keras.__version__, "bench": bench, "size": f"b{B}",
                      "value": round(value, 3), "unit": unit}), flush=True)


m = model()
x = np.random.rand(B * STEPS, 32, 32, 3).astype(np.float32)
y = (np.arange(B * STEPS) % 10).astype(np.int32)
m.fit(x, y, batch_size=B, epochs=1, verbose=0)
best = float("inf")
for _ in range(4):
    t = time.perf_counter()
    m.fit(x, y, batch_size=B, epochs=1, verbose=0)
    best = min(best, (time.perf_counter() - t) / STEPS)
emit("cifar_cnn_train_step", 1 / best, "steps/s")
xi = x[: B * 4]
m.predict(xi, batch_size=B, verbose=0)
best = float("inf")
for _ in range(8):
    t = time.perf_counter()
    m.predict(xi, batch_size=B, verbose=0)
    best = min(best, time.perf_counter() - t)
emit("cifar_cnn_infer", len(xi) / best, "samples/s")
