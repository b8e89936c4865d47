#!/usr/bin/env bash
# One device call for the compiler changes of stops 35-36 (each step gets what is left of the
# call's LIMIT seconds, default 330, so the call returns with whatever finished; give it 560):
#   1. the GPU tests of the batch norm (the generated forward is the CUDA default since stop 35)
#      and of the specialized runner (outputs stored into graph inputs, misaligned buffers);
#   2. ResNet-50's training step, Inductor and kernelab interleaved in one process
#      (host_events.py): kernelab's default (generated forward, ATen backward), ATen's forward
#      (kernelab-bnaten) and both generated (kernelab-bnall);
#   3. ResNet-50's kernel list (zoo_profile.py), kernelab and Inductor: where the GPU time goes;
#   4. T5's host events, kernelab against Inductor: which host calls make kernelab's step slower;
#   5. Llama's kernel list against Inductor's (GPU-bound, 0.95x) if time is left.
set -uo pipefail
OUT="${OUT:-out}"; mkdir -p "$OUT"; LIMIT="${LIMIT:-330}"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
left() {  # seconds a step may take: its own limit, or what is left of the call's LIMIT
    local rest=$((LIMIT - SECONDS)); echo $(( rest < $1 ? (rest > 5 ? rest : 5) : $1 ))
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout "$(left 100)" python3 -m pytest tests/gpu/test_batch_norm_gpu.py tests/gpu/test_fast_runner_gpu.py -q \
    -p no:cacheprovider -W ignore -rf --tb=line > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? (${SECONDS}s)"; grep -E "passed|failed|^FAILED" "$OUT/gpu_tests.txt" | head -10
timeout "$(left 200)" python3 benchmarks/host_events.py "$OUT/he_resnet" resnet:train --loss-fn --no-events \
    --modes inductor,kernelab,kernelab-bnaten,kernelab-bnall --rounds 3 > "$OUT/host_events_resnet.log" 2>&1
echo "host_events resnet rc=$? (${SECONDS}s)"; grep "==\|failed" "$OUT/host_events_resnet.log" | cut -c1-230
timeout "$(left 100)" python3 benchmarks/zoo_profile.py "$OUT/zp_resnet" resnet:train --modes kernelab,inductor \
    --top 30 --loss-fn > "$OUT/zoo_profile_resnet.log" 2>&1
echo "zoo_profile resnet rc=$? (${SECONDS}s)"; grep "^==" "$OUT/zoo_profile_resnet.log" | cut -c1-230
timeout "$(left 130)" python3 benchmarks/host_events.py "$OUT/he_t5" t5:train --loss-fn --modes inductor,kernelab \
    --rounds 1 --top 40 > "$OUT/host_events_t5.log" 2>&1
echo "host_events t5 rc=$? (${SECONDS}s)"; grep "==\|failed" "$OUT/host_events_t5.log" | cut -c1-230
timeout "$(left 100)" python3 benchmarks/zoo_profile.py "$OUT/zp_llama" llama:train --modes inductor,kernelab \
    --top 25 --loss-fn > "$OUT/zoo_profile_llama.log" 2>&1
echo "zoo_profile llama rc=$? (${SECONDS}s)"; grep "^==" "$OUT/zoo_profile_llama.log" | cut -c1-230
