#!/usr/bin/env bash
# One device call for the compiler changes of stop 31 (under 10 minutes; each step gets what is
# left of 570 s, so the call returns with whatever finished):
#   1. GPU tests against eager: tests/gpu/test_batch_norm_gpu.py (KERNELAB_BN_FORWARD=generated,
#      now decomposed after partitioning: ATen's backward formula), test_reuse_gpu.py;
#   2. ResNet-50's training step (zoo_profile.py: GPU time, kernels, host time, peak) with ATen's
#      batch norm and with the generated forward, in the same run: which is the default;
#   3. the zoo, Inductor against kernelab, training step and inference (models.py; outputs stored
#      over inputs since stop 30), for whatever time is left: Llama first, ResNet last.
# Everything lands under $OUT (default ./out); the device returns at most 8 files.
set -uo pipefail
OUT="${OUT:-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
left() {  # seconds a step may take: its own limit, or what is left of the call's 570 s
    local rest=$((570 - SECONDS)); echo $(( rest < $1 ? (rest > 5 ? rest : 5) : $1 ))
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout "$(left 120)" python3 -m pytest tests/gpu/test_batch_norm_gpu.py tests/gpu/test_reuse_gpu.py \
    -q -p no:cacheprovider -W ignore > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? (${SECONDS}s)"; grep -E "passed|failed|^FAILED|^E  " "$OUT/gpu_tests.txt" | head -20
profile() {  # label, forward setting
    KERNELAB_BN_FORWARD=$2 timeout "$(left 80)" python3 benchmarks/zoo_profile.py "$OUT/rn_$1" \
        resnet:train --modes kernelab --top 10 > "$OUT/rn_$1.log" 2>&1
    echo "== resnet train, forward $2 (rc=$?, ${SECONDS}s)"; grep -A6 "^==" "$OUT/rn_$1.log" | cut -c1-160
    { echo "### KERNELAB_BN_FORWARD=$2"; cat "$OUT/rn_$1.log"; } >> "$OUT/resnet_bn.log"
    rm -rf "$OUT/rn_$1" "$OUT/rn_$1.log"
}
profile aten aten
profile generated generated
rest=$((560 - SECONDS))
timeout "$(left 560)" python3 benchmarks/models.py "$OUT/zoo" --only llama,bert,t5,gpt2,vit,convnext,mixtral,resnet \
    --modes inductor,kernelab --steps train,infer --budget-s $((rest > 30 ? rest - 25 : 5)) > "$OUT/zoo.log" 2>&1
echo "models rc=$? (${SECONDS}s)"; tail -24 "$OUT/zoo.log" | cut -c1-170
