#!/usr/bin/env bash
# One device call that checks the last changes on the GPU (about 8 minutes on an H200):
#   1. the norms at non-power-of-two and long widths (benchmarks/norm_tune.py): the default (rows
#      held as a head and a tail; the per-lane looped forward as a setting) against one tile and
#      the looped forward's chunk / warps settings, next to eager, torch.compile and Liger;
#      every setting checked against float64 first;
#   2. softmax / log_softmax with rows split or as one tile (bench_ops.py --tune-s, GPU time);
#   3. the causal-LM training step (benchmarks/e2e_train.py): eager, kernelab.patch, Liger, compile.
# Carry the Liger wheel (.whl) and install it into /tmp/site first (the device README).
# Everything lands under $OUT (default ./out).
set -uo pipefail
OUT="${OUT:-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout 290 python3 benchmarks/norm_tune.py "$OUT/nt" --budget-s 240 --widths 2880 5120 6144 12288 16384 \
    --settings "fwd one tile" "fwd looped past 8192" "fwd looped 1024 x 4w" "fwd looped 4096 x 8w" "bwd one tile" \
    > "$OUT/norm_tune.log" 2>&1
echo "norm_tune rc=$?"; grep -E "checks|wrong|error|skipped" "$OUT/norm_tune.log" | head -5
tail -24 "$OUT/norm_tune.log" | cut -c1-230
timeout 100 python3 benchmarks/bench_ops.py "$OUT/tune" --tune-s 75 --timer kernels > "$OUT/tune.log" 2>&1
echo "tune rc=$?"; tail -24 "$OUT/tune.log" | cut -c1-160
timeout 170 python3 benchmarks/e2e_train.py "$OUT/e2e" --budget-s 120 > "$OUT/e2e.log" 2>&1
echo "e2e rc=$?"; tail -16 "$OUT/e2e.log" | cut -c1-200
