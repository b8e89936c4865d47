#!/usr/bin/env bash
# One device call for the compiler and ops changes of stop 32 (each step gets what is left of the
# call's LIMIT seconds, default 330, so the call returns with whatever finished; give it 560 for
# everything):
#   1. GPU tests of the specialized runner (test_fast_runner_gpu.py: zoo training steps against
#      eager, other layouts) and of the launch paths it takes over (direct launch, reuse, CUDA graphs);
#   2. host time of compiled steps, the modes timed in interleaved rounds in one process
#      (host_events.py): ViT-B/16's training step and GPT-2's inference, Inductor against kernelab
#      with and without the specialized runner (kernelab-nofast: KERNELAB_FAST_RUNNER=0);
#   3. the ops grid for bias_gelu (its broadcast no longer through torch.broadcast_shapes) and
#      cross_entropy (fwd+bwd at 151936 and 262144 words ran out of memory in the float64
#      comparison before), against eager, torch.compile and Liger.
# Carry the Liger wheel (.whl) and install it into /tmp/site first (the device README).
set -uo pipefail
OUT="${OUT:-out}"; mkdir -p "$OUT"; LIMIT="${LIMIT:-330}"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
left() {  # seconds a step may take: its own limit, or what is left of the call's LIMIT
    local rest=$((LIMIT - SECONDS)); echo $(( rest < $1 ? (rest > 5 ? rest : 5) : $1 ))
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
# the specialized runner's GPU test alone first (stop 32's call ran out of time inside it, its one
# failure unread): each failure's message is printed as it happens (-rf, --tb=line)
timeout "$(left 150)" python3 -m pytest tests/gpu/test_fast_runner_gpu.py -q -p no:cacheprovider -W ignore -rf --tb=line \
    > "$OUT/gpu_tests.txt" 2>&1
echo "fast runner gpu tests rc=$? (${SECONDS}s)"; grep -E "passed|failed|^FAILED|Error|assert" "$OUT/gpu_tests.txt" | head -20
timeout "$(left 110)" python3 -m pytest tests/gpu/test_direct_launch.py tests/gpu/test_reuse_gpu.py tests/gpu/test_cudagraphs_gpu.py \
    -q -p no:cacheprovider -W ignore -rf --tb=line >> "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? (${SECONDS}s)"; grep -E "passed|failed|^FAILED|Error|assert" "$OUT/gpu_tests.txt" | tail -10
timeout "$(left 100)" python3 benchmarks/host_events.py "$OUT/he" vit:train gpt2:infer --loss-fn --no-events \
    --modes inductor,kernelab,kernelab-nofast --rounds 5 > "$OUT/host_events.log" 2>&1
echo "host_events rc=$? (${SECONDS}s)"; grep "==\|failed" "$OUT/host_events.log" | cut -c1-230
timeout "$(left 150)" python3 benchmarks/bench_ops.py "$OUT/grid" --ops bias_gelu cross_entropy --grid model --graph \
    --workers 4 --budget-s $(( $(left 150) - 30 )) > "$OUT/grid.log" 2>&1
echo "grid rc=$? (${SECONDS}s)"; rm -f "$OUT"/grid/*.png; grep -E "checks|total|still allocated|error" "$OUT/grid.log" | cut -c1-160 | head -12
tail -14 "$OUT/grid.log" | cut -c1-150
