#!/usr/bin/env bash
# One of weft's Cpu benches against the same models in Keras 3 on JAX, interleaved in ROUNDS
# rounds (default 3): prints each figure as JSON, then for every figure both report the median of
# the per-round ratios (weft / Keras: above 1, weft is faster).
#
#     bash benches/peers/keras_side.sh BENCH PEER_SCRIPT      # from the project root
#     bash benches/peers/keras_side.sh text_models benches/peers/text_keras.py
# Keras and JAX come from the peer kit's virtual environment (PEERS_VENV, default
# /tmp/weft-peers-venv, which ../shared/peers/side-by-side.sh sets up), else they are installed there.
set -euo pipefail
bench="$1"
peer="$2"
rounds="${ROUNDS:-3}"
venv="${PEERS_VENV:-/tmp/weft-peers-venv}"
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/xdg-$(id -u)}"
if [[ ! -x $venv/bin/python ]]; then
  python3 -m venv "$venv" && "$venv/bin/pip" install -q "jax[cpu]" keras >&2
fi
cargo bench --bench "$bench" --no-run >&2
rows=()
for r in $(seq "$rounds"); do
  w=$(WEFT_BENCH_DEVICES=cpu cargo bench --bench "$bench" 2>/dev/null | grep '^{')
  k=$("$venv/bin/python" "$peer" 2>/dev/null | grep '"peer"')
  echo "$w"
  echo "$k"
  rows+=("$w" "$k")
done
printf '%s\n' "${rows[@]}" | python3 -c '
import json, statistics, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
peer = {r["bench"] for r in rows if r.get("peer") == "keras-jax"}
for bench in sorted({r["bench"] for r in rows if "peer" not in r} & peer):
    w = [r["value"] for r in rows if r["bench"] == bench and "peer" not in r]
    k = [r["value"] for r in rows if r["bench"] == bench and r.get("peer") == "keras-jax"]
    ratios = [a / b for a, b in zip(w, k)]
    print(json.dumps({"ratio": f"{bench} weft/keras-jax", "rounds": [round(x, 3) for x in ratios],
                      "median": round(statistics.median(ratios), 3)}))
'
