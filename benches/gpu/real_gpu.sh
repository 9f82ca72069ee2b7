#!/usr/bin/env bash
# weft on a real GPU, in one prepared run: f32 matmul GFLOP/s at 1024 to 8192 against the
# adapter's FMA ceiling (and each WGSL kernel variant), the MLP training step and inference, MLPs
# of other shapes with the host's CPU time per training step (mlp_shape_train_host: what bounds a
# small model's step on a fast GPU), the tiny_gpt training run and tensor_parallel split over the
# adapter (several devices on it).
#
#   bash benches/gpu/real_gpu.sh prepare        # where Rust is: release binaries into .devrun/
#   bash benches/gpu/real_gpu.sh run [OUTDIR]   # on the GPU machine (or here, on lavapipe)
#
# The GPU machine needs no toolchain: `prepare` builds the programs here, strips them and fetches
# the Vulkan loader packages a bare machine may lack; `run` unpacks those only when no Vulkan
# loader is installed, then writes each program's output to OUTDIR (default $OUT, else
# /tmp/weft-gpu): *.jsonl for the benchmarks, *.log for the examples, adapters.log for what wgpu
# found. With the device tool: run `prepare` here, then the command
#   bash benches/gpu/real_gpu.sh run          with carry [".devrun"]
# Knobs for a slow adapter (lavapipe): SIZES (default 1024,2048,4096,8192), GPT_STEPS (1000),
# TP_STEPS (the example's default), DEVICES (WEFT_BENCH_DEVICES; default: every hardware GPU),
# MLP_SHAPES (WEFT_MLP_SHAPES; default three, tiny to the peers' MLP).
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/../.."
DIR=.devrun

prepare() {
  mkdir -p "$DIR/bin" "$DIR/gl"
  cargo build --release --example tiny_gpt --example tensor_parallel --example devices
  for e in tiny_gpt tensor_parallel devices; do cp "target/release/examples/$e" "$DIR/bin/"; done
  cargo bench --no-run --bench matmul --bench train_step --bench mlp_shapes --message-format=json 2>/dev/null |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("executable") and m.get("target", {}).get("kind") == ["bench"]:
        print(m["target"]["name"], m["executable"])' |
    while read -r name exe; do cp "$exe" "$DIR/bin/$name"; done
  strip "$DIR"/bin/*
  # The loader packages (as the device tool's README gives them); a machine that has a loader
  # does not use them.
  if ! ls "$DIR"/gl/libvulkan1*.deb >/dev/null 2>&1; then
    local o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
    mkdir -p /tmp/amd64/partial
    # shellcheck disable=SC2086
    apt-get $o update >/dev/null && (cd "$DIR/gl" && apt-get $o download libvulkan1 >/dev/null) ||
      echo "real_gpu: could not fetch the Vulkan loader package; run needs one installed" >&2
  fi
  du -sh "$DIR"
  ls -la "$DIR/bin"
}

run() {
  local out="${1:-${OUT:-/tmp/weft-gpu}}"
  mkdir -p "$out"
  [[ -x $DIR/bin/matmul ]] || { echo "real_gpu: no $DIR/bin/matmul: run 'prepare' first" >&2; exit 1; }
  if ! ldconfig -p | grep -q 'libvulkan.so.1'; then
    for f in "$DIR"/gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
  fi
  local icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  if [[ -f $icd && -z ${VK_DRIVER_FILES:-} ]]; then export VK_DRIVER_FILES=$icd; fi
  export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp/xdg-$(id -u)}; mkdir -p -m 700 "$XDG_RUNTIME_DIR"
  export WEFT_BENCH_DEVICES=${DEVICES:-gpu}
  { nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv 2>/dev/null || true
    "$DIR/bin/devices"; } 2>&1 | tee "$out/adapters.log"
  WEFT_BENCH_SIZES=${SIZES:-1024,2048,4096,8192} "$DIR/bin/matmul" --bench 2>&1 | tee "$out/matmul.jsonl"
  "$DIR/bin/train_step" --bench 2>&1 | tee "$out/train_step.jsonl"
  WEFT_MLP_SHAPES=${MLP_SHAPES:-8:8-8-2,32:784-256-10,256:784-1024-1024-10} "$DIR/bin/mlp_shapes" --bench 2>&1 |
    tee "$out/mlp_shapes.jsonl"
  # The examples take the best hardware GPU (WEFT_DEVICE=gpu asks for lavapipe where it is alone).
  "$DIR/bin/tiny_gpt" --steps "${GPT_STEPS:-1000}" 2>&1 | tee "$out/tiny_gpt.log"
  "$DIR/bin/tensor_parallel" ${TP_STEPS:+--steps "$TP_STEPS"} 2>&1 | tee "$out/tensor_parallel.log"
}

case "${1:-}" in
  prepare) prepare ;;
  run) shift; run "$@" ;;
  *) echo "usage: bash benches/gpu/real_gpu.sh prepare | run [OUTDIR]" >&2; exit 2 ;;
esac
