#!/usr/bin/env bash
# One device call that re-measures the ops on the GPU (under 9 minutes):
#   1. the model grid of every op (benchmarks/bench_ops.py --grid model --graph): real models'
#      widths and vocabularies, forward and forward+backward, against eager, torch.compile and
#      Liger, each checked against float64 (on the CPU where the GPU cannot hold it); the memory
#      left allocated after a case is printed. Plots are redrawn elsewhere from the CSV
#      (python -m kernelab.bench.report OUT/grid/ops_bench.csv DIR): the device returns 8 files;
#   2. softmax / log_softmax at 5120 with 32 elements a thread against the default
#      (bench_ops.py --tune-s), whatever time is left.
# Carry the Liger wheel (.whl) and install it into /tmp/site first (the device README).
set -uo pipefail
OUT="${OUT:-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 450 python3 benchmarks/bench_ops.py "$OUT/grid" --grid model --graph --budget-s 380 > "$OUT/grid.log" 2>&1
echo "grid rc=$? (${SECONDS}s)"; rm -f "$OUT"/grid/*.png; grep -E "checks|total|still allocated|Error" "$OUT/grid.log" | head -12
tail -32 "$OUT/grid.log" | cut -c1-150
rest=$((560 - SECONDS))
if [ "$rest" -gt 40 ]; then
    timeout "$rest" python3 benchmarks/bench_ops.py "$OUT/tune" --tune-s $((rest - 25)) --timer kernels > "$OUT/tune.log" 2>&1
    echo "tune rc=$? (${SECONDS}s)"; grep -A10 "launch-setting" "$OUT/tune.log" | cut -c1-150
fi
