"""The CIFAR-sized CNN of `cargo bench --bench conv` (cifar_cnn_*) in Keras 3 on JAX, on the CPU:
32x32x3 inputs, Conv2D 32-32 (3x3 same, ReLU), MaxPooling 2, Conv2D 64-64, MaxPooling 2, Flatten,
Dense 128 ReLU, Dense 10; softmax cross-entropy on logits, Adam 1e-3, batch 64, random data.
Prints one JSON line each for training steps/s (model.fit) and inference samples/s (predict)."""
from keras_peer import compiled, keras, measure
import numpy as np

B, STEPS = 64, 20
L = keras.layers


def conv(f):
    return L.Conv2D(f, 3, padding="same", activation="relu")


m = keras.Sequential([keras.Input((32, 32, 3)), conv(32), conv(32), L.MaxPooling2D(2), conv(64), conv(64),
                      L.MaxPooling2D(2), L.Flatten(), L.Dense(128, activation="relu"), L.Dense(10)])
x = np.random.rand(B * STEPS, 32, 32, 3).astype(np.float32)
y = (np.arange(B * STEPS) % 10).astype(np.int32)
measure("cifar_cnn", f"b{B}", compiled(m), x, y, B, x[: B * 4])
