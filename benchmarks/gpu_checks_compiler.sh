#!/usr/bin/env bash
# One device call for the compiler changes of stop 36 (each step gets what is left of the call's
# LIMIT seconds, default 330, so the call returns with whatever finished; give it 560):
#   1. the batch-norm GPU tests, now with channels-last convolutions (KERNELAB_CONV_LAYOUT's default);
#   2. ResNet-50's training step, Inductor and kernelab interleaved in one process
#      (host_events.py): channels-last (the default) against the layouts as traced (kernelab-nchw)
#      and the traced layouts with both batch-norm passes generated (kernelab-nchw-bnall);
#   3. ConvNeXt-T likewise (its blocks permute to channels-last around their LayerNorm);
#   4. ResNet-50's kernel list (zoo_profile.py) under the default;
#   5. T5's training step under stop 34's code (.old34: `git archive 7653704 kernelab
#      benchmarks/host_events.py`, carried) and this code, in two processes: did the step regress
#      (stop 34's H100: 1.05x Inductor; stop 36's: 0.79x)?
set -uo pipefail
OUT="${OUT:-out}"; mkdir -p "$OUT"; LIMIT="${LIMIT:-330}"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
left() {  # seconds a step may take: its own limit, or what is left of the call's LIMIT
    local rest=$((LIMIT - SECONDS)); echo $(( rest < $1 ? (rest > 5 ? rest : 5) : $1 ))
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout "$(left 70)" python3 -m pytest tests/gpu/test_batch_norm_gpu.py -q \
    -p no:cacheprovider -W ignore -rf --tb=line > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? (${SECONDS}s)"; grep -E "passed|failed|^FAILED" "$OUT/gpu_tests.txt" | head -10
timeout "$(left 180)" python3 benchmarks/host_events.py "$OUT/he_resnet" resnet:train --loss-fn --no-events \
    --modes inductor,kernelab,kernelab-nchw,kernelab-nchw-bnall --rounds 3 > "$OUT/host_events_resnet.log" 2>&1
echo "host_events resnet rc=$? (${SECONDS}s)"; grep "==\|failed" "$OUT/host_events_resnet.log" | cut -c1-230
timeout "$(left 130)" python3 benchmarks/host_events.py "$OUT/he_convnext" convnext:train --loss-fn --no-events \
    --modes inductor,kernelab,kernelab-nchw --rounds 3 > "$OUT/host_events_convnext.log" 2>&1
echo "host_events convnext rc=$? (${SECONDS}s)"; grep "==\|failed" "$OUT/host_events_convnext.log" | cut -c1-230
timeout "$(left 60)" python3 benchmarks/zoo_profile.py "$OUT/zp_resnet" resnet:train --modes kernelab \
    --top 25 --loss-fn > "$OUT/zoo_profile_resnet.log" 2>&1
echo "zoo_profile resnet rc=$? (${SECONDS}s)"; grep "^==" "$OUT/zoo_profile_resnet.log" | cut -c1-230
timeout "$(left 80)" python3 benchmarks/host_events.py "$OUT/he_t5_new" t5:train --loss-fn --no-events \
    --modes inductor,kernelab --rounds 2 > "$OUT/host_events_t5_new.log" 2>&1
echo "host_events t5 (this code) rc=$? (${SECONDS}s)"; grep "==\|failed" "$OUT/host_events_t5_new.log" | cut -c1-230
if [ -d .old34 ]; then
    timeout "$(left 80)" env PYTHONPATH="$PWD/.old34" python3 .old34/benchmarks/host_events.py "$OUT/he_t5_old" t5:train \
        --loss-fn --no-events --modes inductor,kernelab --rounds 2 > "$OUT/host_events_t5_old.log" 2>&1
    echo "host_events t5 (stop 34's code) rc=$? (${SECONDS}s)"; grep "==\|failed" "$OUT/host_events_t5_old.log" | cut -c1-230
fi
