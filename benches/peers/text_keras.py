"""The text classifiers of `cargo bench --bench text_models` in Keras 3 on JAX, on the CPU:
an LSTM and a GRU (Embedding 5000x64, LSTM or GRU 128, Dense 2; batch 64 of 64 tokens) and a small transformer
encoder (Embedding 5000x128, two pre-norm blocks: LayerNorm, 4 heads x 32 self-attention,
residual, LayerNorm, Dense 256 tanh-GELU, Dense 128, residual; mean over time, Dense 2; batch 32
of 64 tokens). Softmax cross-entropy on logits, Adam 1e-3, the same token ids as the weft bench.
Prints one JSON line each for training steps/s (model.fit) and inference samples/s (predict)."""
from keras_peer import compiled, keras, measure
import numpy as np

L = keras.layers
VOCAB, LEN, STEPS = 5000, 64, 10


def block(x):
    h = L.LayerNormalization(epsilon=1e-5)(x)
    x = x + L.MultiHeadAttention(4, 32)(h, h)
    h = L.LayerNormalization(epsilon=1e-5)(x)
    h = L.Dense(256, activation=lambda t: keras.activations.gelu(t, approximate=True))(h)
    return x + L.Dense(128)(h)


def transformer():
    ids = keras.Input((LEN,), dtype="int32")
    x = L.Embedding(VOCAB, 128)(ids)
    for _ in range(2):
        x = block(x)
    return keras.Model(ids, L.Dense(2)(L.GlobalAveragePooling1D()(x)))


def tokens(rows):
    i = np.arange(rows * LEN, dtype=np.int64)
    return ((i * 7919 + 13) % (VOCAB - 1) + 1).astype(np.int32).reshape(rows, LEN)


lstm = keras.Sequential([keras.Input((LEN,), dtype="int32"), L.Embedding(VOCAB, 64), L.LSTM(128), L.Dense(2)])
gru = keras.Sequential([keras.Input((LEN,), dtype="int32"), L.Embedding(VOCAB, 64), L.GRU(128), L.Dense(2)])
for name, m, b in [("text_lstm", lstm, 64), ("text_gru", gru, 64), ("text_transformer", transformer(), 32)]:
    y = (np.arange(b * STEPS) % 2).astype(np.int32)
    measure(name, f"b{b}x{LEN}", compiled(m), np.tile(tokens(b), (STEPS, 1)), y, b, tokens(4 * b))
