#!/usr/bin/env bash
# Runs the GPU match benchmark on a machine with a real GPU (x86-64, NVIDIA, Vulkan loader),
# within about 5 minutes, printing figures for 100k and 1M subscriptions with the CPU engine
# beside them. Builds with cargo when it is there; otherwise uses a dissem binary carried in
# target/release/ (build it elsewhere with `cargo build --release -p dissem`).
# Figures and JSON go to $OUT (default /tmp).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=target/release/dissem
OUT=${OUT:-/tmp}
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
if command -v cargo >/dev/null 2>&1; then
    cargo build --release -p dissem
fi
if [ ! -x "$BIN" ]; then
    echo "no $BIN: build it with 'cargo build --release -p dissem' and carry it here" >&2
    exit 2
fi
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,memory.total --format=csv || true
for subs in 100000 1000000; do
    echo "== iot, $subs subscriptions: gpu engine, cpu engine, naive check"
    timeout 150 "$BIN" bench match --workload iot --subs "$subs" --events 20000 --batch 1024 \
        --engine all --check-events 100 --json "$OUT/device-check-$subs.json" 2>"$OUT/device-check-$subs.log"
done
echo "JSON in $OUT/device-check-*.json"
