#!/usr/bin/env bash
# The GPU measurements of issues 3 and 4 in one device call (about 7 minutes on an H200):
#   1. kernelab.ops: the benchmark grid against eager, torch.compile and Liger-Kernel
#      (benchmarks/bench_ops.py; Liger from /tmp/site when the device README's wheel is carried);
#   2. the compiler suite against Inductor, caches in empty directories (cold compiles);
#   3. where the compiler's cold compiles and host time go (compile_breakdown.py, then
#      compiler_overhead.py), caches in empty directories.
# Everything lands under $OUT (default ./out): ops/, compiler/, breakdown/, overhead/ and one log each.
#   bash benchmarks/gpu_session.sh                 # all three
#   bash benchmarks/gpu_session.sh ops compiler    # a subset, in this order
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(ops compiler costs)
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_session.sh: no CUDA GPU here; these measurements run on the device machine" >&2
    exit 2
fi
fresh() { local d; d=$(mktemp -d); export TRITON_CACHE_DIR="$d/triton" TORCHINDUCTOR_CACHE_DIR="$d/inductor" KERNELAB_CACHE="$d/kernelab"; }
for part in "${parts[@]}"; do
    case "$part" in
        ops)
            fresh
            python3 benchmarks/bench_ops.py "$OUT/ops" --budget-s 200 > "$OUT/ops.log" 2>&1
            grep -E "checks|copy ceiling|total" "$OUT/ops.log"
            rm -f "$OUT"/ops/*.png  # redraw here: python -m kernelab.bench.report ops_bench.csv DIR
            ;;
        compiler)
            fresh
            python3 benchmarks/compiler_suite.py "$OUT/compiler" --budget-s 130 > "$OUT/compiler.log" 2>&1
            tail -3 "$OUT/compiler.log"
            ;;
        costs)
            fresh
            python3 benchmarks/compile_breakdown.py "$OUT/breakdown" > "$OUT/breakdown.log" 2>&1
            tail -5 "$OUT/breakdown.log"
            fresh
            python3 benchmarks/compiler_overhead.py "$OUT/overhead" > "$OUT/overhead.log" 2>&1
            tail -40 "$OUT/overhead.log"
            ;;
        *)
            echo "gpu_session.sh: unknown part '$part' (ops, compiler, costs)" >&2
            exit 2
            ;;
    esac
done
