#!/usr/bin/env bash
# MLPs of several shapes, weft's Cpu (benches/mlp_shapes.rs) against a jax.jit step and forward
# of the same shapes (benches/peers/mlp_shapes_jax.py), interleaved in ROUNDS rounds (default 3):
# prints each figure as JSON, then per shape and figure the median of the per-round ratios
# (weft / jax.jit: above 1, weft is faster).
#
#     bash benches/peers/mlp_shapes_side.sh             # from the project root
#     WEFT_MLP_SHAPES=32:784-256-10,256:64-64-64-10 ROUNDS=5 bash benches/peers/mlp_shapes_side.sh
# JAX comes from the peer kit's virtual environment (PEERS_VENV, default /tmp/weft-peers-venv,
# which ../shared/peers/side-by-side.sh sets up). WEFT_MLP_SHAPES and MIN_SECS (default 1) go to
# both sides; stderr of every run goes to $LOG (default /tmp/weft-mlp-shapes.log).
set -euo pipefail
rounds="${ROUNDS:-3}"
venv="${PEERS_VENV:-/tmp/weft-peers-venv}"
log="${LOG:-/tmp/weft-mlp-shapes.log}"
export WEFT_MLP_SECS="${MIN_SECS:-1}" MIN_SECS="${MIN_SECS:-1}"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS must be 1 or more" >&2; exit 1; }
[[ -x $venv/bin/python ]] || { echo "no peer venv at $venv: run ../shared/peers/side-by-side.sh . once" >&2; exit 1; }
: > "$log"
cargo bench --bench mlp_shapes --no-run 2>>"$log"
rows=()
for r in $(seq "$rounds"); do
  w=$(cargo bench -q --bench mlp_shapes 2>>"$log" | grep '^{') || { echo "round $r: the bench failed (see $log)" >&2; exit 1; }
  j=$("$venv/bin/python" benches/peers/mlp_shapes_jax.py 2>>"$log" | grep '^{') ||
    { echo "round $r: the jax peer failed (see $log)" >&2; exit 1; }
  echo "$w"
  echo "$j"
  rows+=("$w" "$j")
done
printf '%s\n' "${rows[@]}" | python3 -c '
import json, statistics, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
def values(side, bench, size):
    return [r["value"] for r in rows if r["bench"] == bench and r["size"] == size and (("peer" in r) == (side == "jax"))]
keys = []
for r in rows:
    if "peer" not in r and (r["bench"], r["size"]) not in keys:
        keys.append((r["bench"], r["size"]))
for bench, size in keys:
    ratios = [a / b for a, b in zip(values("weft", bench, size), values("jax", bench, size))]
    if ratios:
        print(json.dumps({"ratio": f"{bench} {size} weft/jax.jit", "rounds": [round(x, 3) for x in ratios],
                          "median": round(statistics.median(ratios), 3)}))
'
