#!/usr/bin/env bash
# weft's CIFAR-sized CNN on the Cpu (cargo bench --bench conv: cifar_cnn_*) against the same model
# in Keras 3 on JAX (benches/peers/cnn_keras.py); see keras_side.sh.
#
#     bash benches/peers/cnn_side.sh        # from the project root
exec bash "$(dirname "$0")/keras_side.sh" conv "$(dirname "$0")/cnn_keras.py"
