#!/usr/bin/env bash
# Ground truth for issue 13 part 3 in one device call: what the GPU really launches.
#   grids-fit | grids-fresh   the library-heuristic grids of kernelab.truth_grids, eager (and Inductor
#                             for the fresh sample, within a time budget) -> $OUT/grids_<set>_h200.json
#   zoo                       one training step of every zoo model at benchmark size, eager and
#                             Inductor, in the background while the rest runs -> $OUT/zoo_h200.json
#                             (ZOO_ONLY=zoo_a_train,... and ZOO_MODES=inductor narrow it)
#   gpu-tests                 python3 -m pytest tests/gpu
#   report                    benchmarks/model_report.py: the Llama-style model's measured HTML report
#                             (in the background)
#   host                      benchmarks/ops_host.py: host time per kernelab.ops call, eager beside it
# Usage: bash benchmarks/gpu_truth.sh PART...   (each part's log is $OUT/<part>.log)
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_truth.sh: no CUDA GPU here; these recordings run on the device machine" >&2
    exit 2
fi
ZOO_BUDGET_S="${ZOO_BUDGET_S:-420}"
FRESH_BUDGET_S="${FRESH_BUDGET_S:-200}"
background=()
for part in "$@"; do
    case "$part" in
        grids-fit)
            python3 benchmarks/record_truth.py "$OUT/grids_fit_h200.json" --set grids-fit --modes eager \
                > "$OUT/grids-fit.log" 2>&1; tail -2 "$OUT/grids-fit.log" ;;
        grids-fresh)
            python3 benchmarks/record_truth.py "$OUT/grids_fresh_h200.json" --set grids-fresh \
                --budget-s "$FRESH_BUDGET_S" > "$OUT/grids-fresh.log" 2>&1; tail -2 "$OUT/grids-fresh.log" ;;
        zoo)
            python3 benchmarks/record_truth.py "$OUT/zoo_h200.json" --set zoo --budget-s "$ZOO_BUDGET_S" \
                --modes "${ZOO_MODES:-eager,inductor}" ${ZOO_ONLY:+--only "$ZOO_ONLY"} \
                --warmup 2 --repeat 2 > "$OUT/zoo.log" 2>&1 &
            background+=($!) ;;
        gpu-tests)
            python3 -m pytest -q -p no:cacheprovider tests/gpu > "$OUT/gpu-tests.log" 2>&1; tail -3 "$OUT/gpu-tests.log" ;;
        report)  # in the background, like zoo
            python3 benchmarks/model_report.py "$OUT/report" --budget-s "${REPORT_BUDGET_S:-200}" > "$OUT/report.log" 2>&1 &
            background+=($!) ;;
        host)
            python3 benchmarks/ops_host.py "$OUT/host" --budget-s 120 > "$OUT/host.log" 2>&1; tail -25 "$OUT/host.log" ;;
        *)
            echo "gpu_truth.sh: unknown part '$part'" >&2; exit 2 ;;
    esac
done
for pid in "${background[@]}"; do wait "$pid"; done
[ -f "$OUT/zoo.log" ] && grep -E "^zoo_|wrote" "$OUT/zoo.log"
[ -f "$OUT/report.log" ] && tail -12 "$OUT/report.log"
exit 0
