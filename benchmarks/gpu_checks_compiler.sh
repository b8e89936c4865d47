#!/usr/bin/env bash
# One device call for the compiler changes of stops 29-30 (under 10 minutes on an H200; each step
# gets what is left of 570 s, so the call returns with whatever finished):
#   1. GPU tests against eager: tests/gpu/test_reuse_gpu.py (outputs stored over inputs: an LM
#      loss's backward peak without the logits' second copy), test_batch_norm_gpu.py
#      (KERNELAB_BN_FORWARD=generated with both backwards, float32 / bfloat16 at ResNet's shapes),
#      test_gathers_gpu.py (interpolations, whose backward's scatters are atomic adds now);
#   2. Llama's training step, Inductor against kernelab (models.py: time, kernels, peak memory:
#      7.52 against 5.72 GiB before stop 30);
#   3. ResNet-50's training step (zoo_profile.py: GPU time, kernels, host time, peak) with ATen's
#      batch norm, the generated forward, and both generated, in the same run: the default;
#   4. the kernels ATen's _native_batch_norm_legit launches (kernelab.count's rule);
#   5. the interpolation programs of the compiler suite against Inductor (bilinear forward +
#      backward was 0.24x: four place-scatter kernels after a kernel writing their values).
# Everything lands under $OUT (default ./out).
set -uo pipefail
OUT="${OUT:-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
left() {  # seconds a step may take: its own limit, or what is left of the call's 570 s
    local rest=$((570 - SECONDS)); echo $(( rest < $1 ? (rest > 5 ? rest : 5) : $1 ))
}
timeout "$(left 150)" python3 -m pytest tests/gpu/test_reuse_gpu.py tests/gpu/test_batch_norm_gpu.py \
    tests/gpu/test_gathers_gpu.py -q -p no:cacheprovider -W ignore > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? (${SECONDS}s)"; grep -E "passed|failed|^FAILED|^E  " "$OUT/gpu_tests.txt" | head -20
timeout "$(left 150)" python3 benchmarks/models.py "$OUT/llama" --only llama --modes inductor,kernelab --steps train \
    --budget-s 130 > "$OUT/llama.log" 2>&1
echo "llama rc=$? (${SECONDS}s)"; tail -6 "$OUT/llama.log" | cut -c1-170; rm -f "$OUT/llama/models.png"
profile() {  # label, forward, backward
    KERNELAB_BN_FORWARD=$2 KERNELAB_BN_BACKWARD=$3 timeout "$(left 80)" python3 benchmarks/zoo_profile.py "$OUT/rn_$1" \
        resnet:train --modes kernelab --top 10 > "$OUT/rn_$1.log" 2>&1
    echo "== resnet train, forward $2, backward $3 (rc=$?, ${SECONDS}s)"; grep -A10 "^==" "$OUT/rn_$1.log" | cut -c1-160
    { echo "### forward $2, backward $3"; cat "$OUT/rn_$1.log"; } >> "$OUT/resnet_bn.log"
    rm -rf "$OUT/rn_$1" "$OUT/rn_$1.log"  # (the device returns at most 8 files)
}
profile aten aten aten
profile fwd generated aten
profile both generated generated
# 4. which kernels ATen's _native_batch_norm_legit (what the compiled graph calls in ATen mode, not
#    eager's cudnn_batch_norm) launches on NCHW float32 in training (eager_rules.native_batch_norm_legit)
timeout "$(left 45)" python3 - > "$OUT/native_bn_kernels.txt" 2>&1 <<'PY'
import torch
from torch.profiler import profile, ProfilerActivity
x = torch.randn(32, 64, 56, 56, device="cuda")
w, b = torch.ones(64, device="cuda"), torch.zeros(64, device="cuda")
rm, rv = torch.zeros(64, device="cuda"), torch.ones(64, device="cuda")
for _ in range(2):
    torch.ops.aten._native_batch_norm_legit(x, w, b, rm, rv, True, 0.1, 1e-5)
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    torch.ops.aten._native_batch_norm_legit(x, w, b, rm, rv, True, 0.1, 1e-5)
    torch.cuda.synchronize()
for e in prof.events():
    if e.device_type == torch.autograd.DeviceType.CUDA:
        print(f"{e.name[:150]}  {e.device_time:.1f} us")
PY
echo "native batch norm kernels:"; head -8 "$OUT/native_bn_kernels.txt"
timeout "$(left 60)" python3 benchmarks/compiler_suite.py "$OUT/cs" --only upsample_bilinear upsample_nearest \
    upsample_bilinear_fwd_bwd --budget-s 45 > "$OUT/cs.log" 2>&1
echo "compiler suite rc=$? (${SECONDS}s)"; tail -7 "$OUT/cs.log"
