#!/usr/bin/env bash
# One device call for the compiler changes of stop 33 (each step gets what is left of the call's
# LIMIT seconds, default 330, so the call returns with whatever finished; give it 560 for all):
#   1. T5-base's training step, Inductor and kernelab interleaved in one process (host_events.py),
#      then its inference: stop 33 removed T5's lone casts and copies around SDPA's math path
#      (predicted 782 -> 722 kernels and memops; the H100 counted 839 against Inductor's 747);
#   2. kernels a training step on the GPU (zoo_profile.py, kernelab only: Inductor's counts are in
#      results/zoo_profile_t5_stop33_h100.txt and models_h100_stop32.csv) for T5, Llama (RoPE's
#      backward: the rotated sin now joins the gradient's kernel) and Mixtral, with Mixtral's plan
#      (KERNELAB_DEBUG=2: which ops the GPU's MoE path leaves to ATen, 662 vs 497 kernels);
#   3. the specialized runner's GPU test again (it passed in stop 33; the rewrites changed plans).
set -uo pipefail
OUT="${OUT:-out}"; mkdir -p "$OUT"; LIMIT="${LIMIT:-330}"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
left() {  # seconds a step may take: its own limit, or what is left of the call's LIMIT
    local rest=$((LIMIT - SECONDS)); echo $(( rest < $1 ? (rest > 5 ? rest : 5) : $1 ))
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout "$(left 200)" python3 benchmarks/host_events.py "$OUT/he" t5:train t5:infer --loss-fn --no-events \
    --modes inductor,kernelab --rounds 5 > "$OUT/host_events.log" 2>&1
echo "host_events rc=$? (${SECONDS}s)"; grep "==\|failed" "$OUT/host_events.log" | cut -c1-230
timeout "$(left 120)" python3 benchmarks/zoo_profile.py "$OUT/zp" t5:train llama:train --modes kernelab --top 25 \
    --loss-fn > "$OUT/zoo_profile.log" 2>&1
echo "zoo_profile rc=$? (${SECONDS}s)"; grep "==" "$OUT/zoo_profile.log" | cut -c1-200
KERNELAB_DEBUG=2 timeout "$(left 120)" python3 benchmarks/zoo_profile.py "$OUT/zm" mixtral:train --modes kernelab \
    --top 40 --loss-fn > "$OUT/mixtral_profile.log" 2> "$OUT/mixtral_plan_debug.txt"
echo "mixtral rc=$? (${SECONDS}s)"; grep "==" "$OUT/mixtral_profile.log" | cut -c1-200; grep -c "ATen" "$OUT/mixtral_plan_debug.txt"
timeout "$(left 110)" python3 -m pytest tests/gpu/test_fast_runner_gpu.py -q -p no:cacheprovider -W ignore -rf --tb=line \
    > "$OUT/gpu_tests.txt" 2>&1
echo "fast runner gpu tests rc=$? (${SECONDS}s)"; grep -E "passed|failed|^FAILED" "$OUT/gpu_tests.txt" | head -10
