#!/usr/bin/env bash
# weft's text classifiers on the Cpu (cargo bench --bench text_models: an LSTM, a GRU and a small
# transformer encoder) against the same models in Keras 3 on JAX (benches/peers/text_keras.py);
# see keras_side.sh.
#
#     bash benches/peers/text_side.sh       # from the project root
exec bash "$(dirname "$0")/keras_side.sh" text_models "$(dirname "$0")/text_keras.py"
