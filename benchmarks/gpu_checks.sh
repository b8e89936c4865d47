#!/usr/bin/env bash
# One device call that checks the last changes on the GPU (about 8 minutes on an H200):
#   1. the model grid of every op (benchmarks/bench_ops.py --grid model --graph) with today's
#      kernels (rows of non-power-of-two widths split into a head and a tail), against eager,
#      torch.compile and Liger; its plots are redrawn here from the CSV
#      (python -m kernelab.bench.report OUT/grid/ops_bench.csv DIR): the device returns 8 files;
#   2. the norms at 12288-16384, where torch.compile leads the forward: our looped forward at one
#      pipeline stage and 16 warps, and the long-row backward in one kernel (rows re-read from L2)
#      against the stats kernel + column tiles (benchmarks/norm_tune.py); torch.compile's
#      generated source for two of those shapes (benchmarks/ops_kernels.py --code);
#   3. softmax / log_softmax at 5120 with 32 elements a thread (bench_ops.py --tune-s).
# Carry the Liger wheel (.whl) and install it into /tmp/site first (the device README).
set -uo pipefail
OUT="${OUT:-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout 270 python3 benchmarks/bench_ops.py "$OUT/grid" --grid model --graph --budget-s 220 > "$OUT/grid.log" 2>&1
echo "grid rc=$?"; rm -f "$OUT"/grid/*.png "$OUT"/grid/ops_checks.csv; grep -E "checks|total" "$OUT/grid.log" | head -4
tail -22 "$OUT/grid.log" | cut -c1-150
timeout 160 python3 benchmarks/norm_tune.py "$OUT/nt" --budget-s 125 --widths 12288 16384 --workers 4 \
    --settings "fwd looped past 8192" "fwd looped 2048 x 8w, 1 stage" "fwd looped 2048 x 16w, 1 stage" \
    "fwd looped 4096 x 16w" "fwd looped 4096 x 16w, 1 stage" "bwd long one kernel" "bwd long one kernel, 4 per SM" \
    "bwd long one kernel, 2 rows" "bwd long one kernel, 4096 x 16w" > "$OUT/norm_tune.log" 2>&1
echo "norm_tune rc=$?"; grep -E "wrong|error|FAIL" "$OUT/norm_tune.log" | head -5; tail -12 "$OUT/norm_tune.log" | cut -c1-200
timeout 90 python3 benchmarks/ops_kernels.py "$OUT/k" layer_norm:4096x12288:fwd rms_norm:4096x16384:fwd --code \
    > "$OUT/kernels.log" 2>&1
echo "ops_kernels rc=$?"; grep -E "triton_|total|_kernel" "$OUT/kernels.log" | cut -c1-140 | head -20
timeout 60 python3 benchmarks/bench_ops.py "$OUT/tune" --tune-s 25 --timer kernels > "$OUT/tune.log" 2>&1
echo "tune rc=$?"; grep -A10 "launch-setting" "$OUT/tune.log" | cut -c1-150
