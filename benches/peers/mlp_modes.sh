#!/usr/bin/env bash
# weft's MLP training step (benches/train_step.rs) against the peer kit's jax.jit step
# (../shared/peers/keras_jax_mlp.py --only jax), interleaved in ROUNDS rounds (default 6), with
# the two cores' hand-off time (benches/core_handoff.rs) taken before and after each side.
#
#     bash benches/peers/mlp_modes.sh            # from the project root
#
# Why: on a 2-vCPU cloud machine the hypervisor moves the two vCPUs between one core complex and
# two (a hand-off of 50-75 ns or 290-340 ns on a Zen 4, flipping every few seconds to minutes),
# and a step that shares data between its threads is slower on two: weft's by about 18%, XLA's by
# 5-10%. A round's ratio is only fair when both sides ran in the same placement, so besides the
# median over all rounds this prints the median over the rounds where both sides saw one
# placement, for each placement ("near": hand-offs under MODE_SPLIT_NS, default 180 ns, before
# and after both sides; "far": over it). Rounds where it moved are counted, not used.
# Python and JAX come from the peer kit's virtual environment (PEERS_VENV, default
# /tmp/weft-peers-venv, which ../shared/peers/side-by-side.sh sets up).
set -euo pipefail
rounds="${ROUNDS:-6}"
venv="${PEERS_VENV:-/tmp/weft-peers-venv}"
peer="${PEER_MLP:-../shared/peers/keras_jax_mlp.py}"
split="${MODE_SPLIT_NS:-180}"
[[ -x $venv/bin/python ]] || { echo "no peer venv at $venv: run ../shared/peers/side-by-side.sh . once" >&2; exit 1; }
[[ -f $peer ]] || { echo "no peer script at $peer (set PEER_MLP)" >&2; exit 1; }
cargo bench --bench train_step --bench core_handoff --no-run >&2
handoff() { cargo bench -q --bench core_handoff 2>/dev/null | grep '^{' | python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["value"])'; }
rows=()
for r in $(seq "$rounds"); do
  h0=$(handoff)
  w=$(WEFT_BENCH_DEVICES=cpu cargo bench -q --bench train_step 2>/dev/null | grep '"train_step"' | grep -v of_fma)
  h1=$(handoff)
  j=$("$venv/bin/python" "$peer" --only jax 2>/dev/null | grep '"mlp_train_step"' | grep 'steps/s')
  h2=$(handoff)
  line="{\"round\":$r,\"handoff_ns\":[$h0,$h1,$h2],\"weft\":$w,\"jax\":$j}"
  echo "$line"
  rows+=("$line")
done
printf '%s\n' "${rows[@]}" | SPLIT="$split" python3 -c '
import json, os, statistics, sys
split = float(os.environ["SPLIT"])
rows = [json.loads(l) for l in sys.stdin if l.strip()]
def mode(ns):
    return "near" if all(x < split for x in ns) else "far" if all(x >= split for x in ns) else None
out = {"ratio": "mlp train step weft/jax.jit (steps/s)"}
ratios = [(r["weft"]["value"] / r["jax"]["value"], mode(r["handoff_ns"])) for r in rows]
out["all"] = {"median": round(statistics.median(x for x, _ in ratios), 3), "rounds": [round(x, 3) for x, _ in ratios]}
for m in ("near", "far"):
    v = [x for x, y in ratios if y == m]
    if v:
        out[m] = {"median": round(statistics.median(v), 3), "rounds": len(v)}
out["moved"] = sum(1 for _, y in ratios if y is None)
print(json.dumps(out))
'
