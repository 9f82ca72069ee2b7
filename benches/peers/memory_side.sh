#!/usr/bin/env bash
# Resident memory of MLP training, weft (cargo bench --bench train_memory, Cpu) against Keras 3
# on JAX (benches/peers/mlp_memory.py): each in a fresh process, interleaved in ROUNDS rounds
# (default 3). Prints each figure as JSON, then per round the ratio of peak resident memory
# (weft / Keras: below 1, weft needs less) and each side's growth from step 100 to step 1,000.
#
#     bash benches/peers/memory_side.sh        # from the project root
#
# Python: $PYTHON, else the peer kit's virtual environment (/tmp/weft-peers-venv, made by
# ../shared/peers/side-by-side.sh) when it exists, else python3 (Keras and JAX installed with pip
# when missing).
set -euo pipefail
rounds="${ROUNDS:-3}"
py="${PYTHON:-}"
if [ -z "$py" ]; then
  if [ -x /tmp/weft-peers-venv/bin/python ]; then py=/tmp/weft-peers-venv/bin/python; else py=python3; fi
fi
"$py" -c "import numpy, jax, keras" 2>/dev/null || "$py" -m pip install --quiet numpy "jax[cpu]" keras >&2
cargo bench --bench train_memory --no-run >&2
[ "$rounds" -ge 1 ] || { echo "ROUNDS must be at least 1" >&2; exit 2; }
# Each side's figures, or a message saying which side gave none (its own errors are shown).
figures() {
  local who="$1"; shift
  local out
  out=$("$@" | grep '"train_' || true)
  [ -n "$out" ] || { echo "$who printed no resident-memory figures (they are read on Linux only)" >&2; exit 1; }
  printf '%s\n' "$out"
}
lines=()
for r in $(seq "$rounds"); do
  w=$(figures weft cargo bench --bench train_memory)
  k=$(figures keras-jax "$py" benches/peers/mlp_memory.py)
  echo "$w"
  echo "$k"
  lines+=("$(printf '%s\n%s' "$w" "$k" | python3 -c 'import json,sys; print(json.dumps([json.loads(l) for l in sys.stdin if l.strip()]))')")
done
python3 - "${lines[@]}" <<'PY'
import json, statistics, sys
rounds = [json.loads(a) for a in sys.argv[1:]]
def fig(r, who, bench):
    return next(d["value"] for d in r if d["bench"] == bench and (("peer" in d) == (who == "keras")))
peak = [fig(r, "weft", "train_peak_rss") / fig(r, "keras", "train_peak_rss") for r in rounds]
grow = {who: [fig(r, who, "train_rss_1000_steps") - fig(r, who, "train_rss_100_steps") for r in rounds]
        for who in ("weft", "keras")}
print(json.dumps({"ratio": "train_peak_rss weft/keras-jax", "rounds": [round(p, 3) for p in peak],
                  "median": round(statistics.median(peak), 3),
                  "growth_100_to_1000_steps_mib": {w: [round(g, 1) for g in v] for w, v in grow.items()}}))
PY
