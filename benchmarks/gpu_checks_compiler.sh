#!/usr/bin/env bash
# One device call for the compiler changes of stops 34-35 (each step gets what is left of the
# call's LIMIT seconds, default 330, so the call returns with whatever finished; give it 560):
#   1. the specialized runner's GPU tests first: view aliases (stop 34) and outputs stored into
#      graph inputs in place (stop 35: batch norm's running statistics), both new on the GPU path;
#   2. host and step times, Inductor and kernelab interleaved in one process (host_events.py):
#      ResNet-50 with the generated batch-norm forward too (kernelab-bngen: stop 31 measured its
#      GPU time 5 ms lower but its host 10 ms higher, before the view-alias and in-place fixes),
#      then BERT and ViT (last timed before the host work of stops 32-34);
#   3. MODELS2 (default llama:train mixtral:train t5:train) if time is left.
set -uo pipefail
OUT="${OUT:-out}"; mkdir -p "$OUT"; LIMIT="${LIMIT:-330}"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
left() {  # seconds a step may take: its own limit, or what is left of the call's LIMIT
    local rest=$((LIMIT - SECONDS)); echo $(( rest < $1 ? (rest > 5 ? rest : 5) : $1 ))
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout "$(left 120)" python3 -m pytest tests/gpu/test_fast_runner_gpu.py -q -p no:cacheprovider -W ignore -rf --tb=line \
    > "$OUT/gpu_tests.txt" 2>&1
echo "fast runner gpu tests rc=$? (${SECONDS}s)"; grep -E "passed|failed|^FAILED" "$OUT/gpu_tests.txt" | head -10
timeout "$(left 200)" python3 benchmarks/host_events.py "$OUT/he_resnet" resnet:train \
    --loss-fn --no-events --modes inductor,kernelab,kernelab-bngen --rounds 3 > "$OUT/host_events_resnet.log" 2>&1
echo "host_events resnet rc=$? (${SECONDS}s)"; grep "==\|failed" "$OUT/host_events_resnet.log" | cut -c1-230
timeout "$(left 200)" python3 benchmarks/host_events.py "$OUT/he" bert:train vit:train \
    --loss-fn --no-events --modes inductor,kernelab --rounds 3 > "$OUT/host_events.log" 2>&1
echo "host_events rc=$? (${SECONDS}s)"; grep "==\|failed" "$OUT/host_events.log" | cut -c1-230
timeout "$(left 300)" python3 benchmarks/host_events.py "$OUT/he2" ${MODELS2:-llama:train mixtral:train t5:train} \
    --loss-fn --no-events --modes inductor,kernelab --rounds 3 > "$OUT/host_events2.log" 2>&1
echo "host_events2 rc=$? (${SECONDS}s)"; grep "==\|failed" "$OUT/host_events2.log" | cut -c1-230
