#!/usr/bin/env bash
# weft's MLP training step (benches/train_step.rs with WEFT_STEP_BLOCKS) against the peer kit's
# jax.jit step (../shared/peers/keras_jax_mlp.py --only jax), both measured the kit's way (median
# of 5 blocks of steps after a warm-up), interleaved in ROUNDS rounds (default 6), with the two
# cores' hand-off time (benches/core_handoff.rs) taken before and after each side.
#
#     bash benches/peers/mlp_modes.sh            # from the project root
#
# Why: on a 2-vCPU cloud machine the hypervisor moves the two vCPUs between one core complex and
# two (a hand-off of 50-80 ns or 290-350 ns on a Zen 4, flipping every few seconds to minutes),
# and a step that shares data between its threads is slower on two, weft's more than XLA's. A
# round's ratio is only a fair pair when both sides ran in the same placement, so besides the
# median over all rounds this prints the median over the rounds where both sides saw one
# placement, for each ("near": every hand-off under MODE_SPLIT_NS, default 180 ns; "far": every
# one over it). Rounds where the placement moved count in "all" only.
# Python and JAX come from the peer kit's virtual environment (PEERS_VENV, default
# /tmp/weft-peers-venv, which ../shared/peers/side-by-side.sh sets up). MIN_SECS (default 1) is
# each side's measuring time; stderr of every run goes to $LOG (default /tmp/weft-mlp-modes.log).
set -euo pipefail
rounds="${ROUNDS:-6}"
venv="${PEERS_VENV:-/tmp/weft-peers-venv}"
peer="${PEER_MLP:-../shared/peers/keras_jax_mlp.py}"
split="${MODE_SPLIT_NS:-180}"
secs="${MIN_SECS:-1}"
log="${LOG:-/tmp/weft-mlp-modes.log}"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS must be 1 or more" >&2; exit 1; }
[[ -x $venv/bin/python ]] || { echo "no peer venv at $venv: run ../shared/peers/side-by-side.sh . once" >&2; exit 1; }
[[ -f $peer ]] || { echo "no peer script at $peer (set PEER_MLP)" >&2; exit 1; }
: > "$log"
cargo bench --bench train_step --bench core_handoff --no-run 2>>"$log"
fail() { echo "round $1: $2 (see $log)" >&2; exit 1; }
handoff() {
  cargo bench -q --bench core_handoff 2>>"$log" | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["value"])'
}
rows=()
for r in $(seq "$rounds"); do
  h0=$(handoff) || fail "$r" "core_handoff gave no figure"
  w=$(WEFT_BENCH_DEVICES=cpu WEFT_STEP_BLOCKS="$secs" cargo bench -q --bench train_step 2>>"$log" | grep '"train_step_blocks"') \
    || fail "$r" "train_step gave no train_step_blocks line"
  h1=$(handoff) || fail "$r" "core_handoff gave no figure"
  j=$("$venv/bin/python" "$peer" --only jax --min-secs "$secs" 2>>"$log" | grep '"mlp_train_step"' | grep '"steps/s"') \
    || fail "$r" "the jax peer gave no mlp_train_step line in steps/s"
  h2=$(handoff) || fail "$r" "core_handoff gave no figure"
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
ratios = [(r["weft"]["value"] / r["jax"]["value"], mode(r["handoff_ns"])) for r in rows]
out = {"ratio": "mlp train step weft/jax.jit (steps/s)"}
for name, pick in (("all", lambda m: True), ("near", lambda m: m == "near"), ("far", lambda m: m == "far")):
    v = [x for x, m in ratios if pick(m)]
    if v:
        out[name] = {"median": round(statistics.median(v), 3), "ratios": [round(x, 3) for x in v]}
out["moved"] = sum(1 for _, m in ratios if m is None)
print(json.dumps(out))
'
