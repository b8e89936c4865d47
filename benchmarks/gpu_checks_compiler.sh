#!/usr/bin/env bash
# One device call for the compiler changes of stop 34 (each step gets what is left of the call's
# LIMIT seconds, default 330, so the call returns with whatever finished; give it 560 for all):
#   1. the specialized runner's GPU test first: since stop 34 it writes the recorded view aliases
#      (it had replayed every chain of views through ViewChain), new on the GPU's path;
#   2. host and step times, Inductor and kernelab interleaved in one process (host_events.py), for
#      the host-bound training steps: ViT, Llama, Mixtral, T5 (the view aliases should lower
#      every one's host time; stop 34 measured ViT 0.98x, Llama 0.99x, Mixtral 0.92x, T5 1.05x);
#   3. kernels a training step on the GPU (zoo_profile.py) for Llama and Mixtral, Inductor's too:
#      Mixtral's gap (644 vs 497 kernels) needs Inductor's GPU kernel list beside kernelab's.
set -uo pipefail
OUT="${OUT:-out}"; mkdir -p "$OUT"; LIMIT="${LIMIT:-330}"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
left() {  # seconds a step may take: its own limit, or what is left of the call's LIMIT
    local rest=$((LIMIT - SECONDS)); echo $(( rest < $1 ? (rest > 5 ? rest : 5) : $1 ))
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout "$(left 110)" python3 -m pytest tests/gpu/test_fast_runner_gpu.py -q -p no:cacheprovider -W ignore -rf --tb=line \
    > "$OUT/gpu_tests.txt" 2>&1
echo "fast runner gpu tests rc=$? (${SECONDS}s)"; grep -E "passed|failed|^FAILED" "$OUT/gpu_tests.txt" | head -10
timeout "$(left 260)" python3 benchmarks/host_events.py "$OUT/he" vit:train llama:train mixtral:train t5:train \
    --loss-fn --no-events --modes inductor,kernelab --rounds 3 > "$OUT/host_events.log" 2>&1
echo "host_events rc=$? (${SECONDS}s)"; grep "==\|failed" "$OUT/host_events.log" | cut -c1-230
timeout "$(left 150)" python3 benchmarks/zoo_profile.py "$OUT/zp" mixtral:train llama:train --modes inductor,kernelab \
    --top 40 --loss-fn > "$OUT/zoo_profile.log" 2>&1
echo "zoo_profile rc=$? (${SECONDS}s)"; grep "==" "$OUT/zoo_profile.log" | cut -c1-200
