#!/usr/bin/env bash
# One device call that checks the last changes on the GPU (about 5 minutes on an H200):
#   1. the GPU tests of special values and gathers (CUDA eager as the reference);
#   2. the compiler's plan of interpolations on CUDA (benchmarks/plan_on_gpu.py);
#   3. the interpolation programs of the compiler suite against Inductor;
#   4. T5 inference against Inductor (zoo_profile.py, with the step's memory peak);
#   5. ResNet-50's training step with ATen's batch norm backward and with the generated one
#      (KERNELAB_BN_BACKWARD=generated), in the same run.
# Everything lands under $OUT (default ./out).
set -uo pipefail
OUT="${OUT:-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout 150 python3 -m pytest tests/gpu/test_special_values_gpu.py tests/gpu/test_gathers_gpu.py -q \
    -p no:cacheprovider -W ignore > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$?"; grep -E "passed|failed|^FAILED|^E  " "$OUT/gpu_tests.txt" | head -20
timeout 60 python3 benchmarks/plan_on_gpu.py bicubic_float32 bilinear_bfloat16 > "$OUT/plans.txt" 2>&1
grep -E "===|failed|ATen" "$OUT/plans.txt" | cut -c1-220 | head
timeout 60 python3 benchmarks/compiler_suite.py "$OUT/cs" --only upsample_bilinear upsample_nearest \
    upsample_bilinear_fwd_bwd --budget-s 45 > "$OUT/cs.log" 2>&1
tail -7 "$OUT/cs.log"
timeout 120 python3 benchmarks/zoo_profile.py "$OUT/t5" t5:infer --modes kernelab,inductor --top 12 --memory \
    > "$OUT/t5.log" 2>&1
grep -A6 "^==" "$OUT/t5.log" | cut -c1-150
timeout 90 python3 benchmarks/zoo_profile.py "$OUT/rn_aten" resnet:train --modes kernelab --top 8 > "$OUT/rn_aten.log" 2>&1
grep -A8 "^==" "$OUT/rn_aten.log" | cut -c1-150
KERNELAB_BN_BACKWARD=generated timeout 90 python3 benchmarks/zoo_profile.py "$OUT/rn_gen" resnet:train \
    --modes kernelab --top 8 > "$OUT/rn_gen.log" 2>&1
grep -A8 "^==" "$OUT/rn_gen.log" | cut -c1-150
rm -rf "$OUT/t5" "$OUT/rn_aten" "$OUT/rn_gen"  # (their zoo_profile.txt repeats the logs: the device returns at most 8 files)
