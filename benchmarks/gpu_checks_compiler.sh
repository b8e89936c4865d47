#!/usr/bin/env bash
# One device call for the compiler changes of stop 29 (about 7 minutes on an H200):
#   1. tests/gpu/test_batch_norm_gpu.py (KERNELAB_BN_FORWARD=generated, both backwards; float32
#      and bfloat16 at ResNet's shapes) and tests/gpu/test_gathers_gpu.py (interpolations, whose
#      backward's scatters are now atomic adds of the generated kernel) against eager;
#   2. the interpolation programs of the compiler suite against Inductor (bilinear forward +
#      backward was 0.24x: four place-scatter kernels after a kernel writing their values);
#   3. ResNet-50's training step (zoo_profile.py: GPU time, kernels, host time, peak) with ATen's
#      batch norm, the generated forward, the generated backward, and both generated,
#      in the same run: which becomes the default;
#   4. the kernels ATen's _native_batch_norm_legit launches (below).
# Everything lands under $OUT (default ./out).
set -uo pipefail
OUT="${OUT:-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout 150 python3 -m pytest tests/gpu/test_batch_norm_gpu.py tests/gpu/test_gathers_gpu.py -q -p no:cacheprovider \
    -W ignore > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$?"; grep -E "passed|failed|^FAILED|^E  " "$OUT/gpu_tests.txt" | head -20
timeout 60 python3 benchmarks/compiler_suite.py "$OUT/cs" --only upsample_bilinear upsample_nearest \
    upsample_bilinear_fwd_bwd --budget-s 45 > "$OUT/cs.log" 2>&1
echo "compiler suite rc=$?"; tail -7 "$OUT/cs.log"
profile() {  # label, forward, backward
    KERNELAB_BN_FORWARD=$2 KERNELAB_BN_BACKWARD=$3 timeout 80 python3 benchmarks/zoo_profile.py "$OUT/rn_$1" \
        resnet:train --modes kernelab --top 10 > "$OUT/rn_$1.log" 2>&1
    echo "== resnet train, forward $2, backward $3 (rc=$?)"; grep -A10 "^==" "$OUT/rn_$1.log" | cut -c1-160
    rm -rf "$OUT/rn_$1"  # (its zoo_profile.txt repeats the log: the device returns at most 8 files)
}
profile aten aten aten
profile fwd generated aten
profile bwd aten generated
profile both generated generated
# 3. which kernels ATen's _native_batch_norm_legit (what the compiled graph calls in ATen mode, not
#    eager's cudnn_batch_norm) launches on NCHW float32 in training: kernelab.count's rule
#    (eager_rules.batch_norm) predicts cuDNN's one kernel for it
timeout 45 python3 - > "$OUT/native_bn_kernels.txt" 2>&1 <<'PY'
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
echo "native batch norm kernels:"; cat "$OUT/native_bn_kernels.txt" | head -8
