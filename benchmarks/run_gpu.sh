#!/usr/bin/env bash
# One device call: ceilings, measured-vs-predicted kernels for the built-in programs, then the
# tour (count + sweep 1e2..1e9, measured). Everything lands in $OUT (or ./out).
#   bash benchmarks/run_gpu.sh            # every program
#   bash benchmarks/run_gpu.sh a,b,c      # only these programs
set -uo pipefail
OUT="${OUT:-out}"; mkdir -p "$OUT"
ONLY="${1:-}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" KERNELAB_CACHE=/tmp/kernelab-cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -m kernelab.cli ceilings 2>&1 | tee "$OUT/ceilings.txt"
cp /tmp/kernelab-cache/*.json "$OUT/ceilings.json" 2>/dev/null
python3 benchmarks/check_counts.py "$OUT/counts_h200.json" ${ONLY:+--only "$ONLY"} > "$OUT/check_counts.txt" 2>&1
tail -70 "$OUT/check_counts.txt"
python3 -m kernelab.cli tour --out "$OUT/tour_sweep.png" --json "$OUT/tour.json" > "$OUT/tour.txt" 2>&1; tail -40 "$OUT/tour.txt"
