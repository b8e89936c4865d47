#!/usr/bin/env bash
# One device call re-measuring the zoo (about 9 minutes on an H200): benchmarks/models.py, Inductor
# against kernelab, training step and inference, every model in processes of its own, in the order
# of what changed most: Llama first (outputs stored over inputs at their last use, stop 30: the
# cross-entropy's gradient over the 2 GB of logits; its peak was 7.52 GiB against Inductor's 5.72),
# then the models whose figures are oldest. The budget stops starting models at 520 s.
set -uo pipefail
OUT="${OUT:-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 benchmarks/models.py "$OUT/zoo" --only llama,bert,t5,gpt2,vit,convnext,mixtral,resnet \
    --modes inductor,kernelab --steps train,infer --budget-s 520 > "$OUT/zoo.log" 2>&1
echo "models rc=$?"; tail -30 "$OUT/zoo.log" | cut -c1-170
