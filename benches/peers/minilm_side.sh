#!/usr/bin/env bash
# weft's MiniLM forward (cargo bench --bench minilm, Cpu) against onnxruntime fp32 with the same
# thread count, interleaved in ROUNDS rounds (default 3); prints each figure as JSON and the
# median of the per-round ratios (weft speed / onnxruntime speed: above 1, weft is faster).
#
#     bash benches/peers/minilm_side.sh [THREADS]     # from the project root
#     WEFT_MINILM_SHAPE=1x128 bash benches/peers/minilm_side.sh 1   # another batch x tokens (both sides)
set -euo pipefail
threads="${1:-2}"
rounds="${ROUNDS:-3}"
model="$(bash scripts/fetch_minilm.sh)"
python3 -c "import numpy, onnx, onnxruntime, tokenizers" 2>/dev/null || python3 -m pip install --quiet numpy onnx onnxruntime tokenizers >&2
cargo bench --bench minilm --no-run >&2
ratios=()
for r in $(seq "$rounds"); do
  w=$(RAYON_NUM_THREADS="$threads" WEFT_BENCH_DEVICES=cpu cargo bench --bench minilm 2>/dev/null | grep '"minilm_forward"' | tail -1)
  o=$(python3 benches/peers/minilm_ort.py "$model" "$threads" | tail -1)
  echo "$w"
  echo "$o"
  ratios+=("$(python3 -c 'import json,sys; print(json.loads(sys.argv[2])["value"] / json.loads(sys.argv[1])["value"])' "$w" "$o")")
done
python3 - "$threads" "${ratios[@]}" <<'PY'
import json, statistics, sys
threads, ratios = int(sys.argv[1]), [float(r) for r in sys.argv[2:]]
print(json.dumps({"ratio": "minilm_forward weft/onnxruntime", "threads": threads,
                  "rounds": [round(r, 3) for r in ratios], "median": round(statistics.median(ratios), 3)}))
PY
