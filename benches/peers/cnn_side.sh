#!/usr/bin/env bash
# weft's CIFAR-sized CNN on the Cpu (cargo bench --bench conv: cifar_cnn_*) against the same model
# in Keras 3 on JAX (benches/peers/cnn_keras.py), interleaved in ROUNDS rounds (default 3); prints
# each figure as JSON and the median of the per-round ratios (weft / Keras: above 1, weft is faster).
#
#     bash benches/peers/cnn_side.sh        # from the project root
# Keras and JAX come from the peer kit's virtual environment (PEERS_VENV, default
# /tmp/weft-peers-venv, which ../shared/peers/side-by-side.sh sets up), else they are installed there.
set -euo pipefail
rounds="${ROUNDS:-3}"
venv="${PEERS_VENV:-/tmp/weft-peers-venv}"
if [[ ! -x $venv/bin/python ]]; then
  python3 -m venv "$venv" && "$venv/bin/pip" install -q "jax[cpu]" keras >&2
fi
cargo bench --bench conv --no-run >&2
rows=()
for r in $(seq "$rounds"); do
  w=$(WEFT_BENCH_DEVICES=cpu cargo bench --bench conv 2>/dev/null | grep '"cifar_cnn_')
  k=$("$venv/bin/python" benches/peers/cnn_keras.py 2>/dev/null | grep cifar_cnn_)
  echo "$w"
  echo "$k"
  rows+=("$w" "$k")
done
printf '%s\n' "${rows[@]}" | python3 -c '
import json, statistics, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
for bench in ("cifar_cnn_train_step", "cifar_cnn_infer"):
    w = [r["value"] for r in rows if r["bench"] == bench and "peer" not in r]
    k = [r["value"] for r in rows if r["bench"] == bench and r.get("peer") == "keras-jax"]
    ratios = [a / b for a, b in zip(w, k)]
    if ratios:
        print(json.dumps({"ratio": f"{bench} weft/keras-jax", "rounds": [round(x, 3) for x in ratios],
                          "median": round(statistics.median(ratios), 3)}))
'
