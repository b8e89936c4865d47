#!/usr/bin/env bash
# Wheels for benchmarks/models.py on a device machine whose image lacks them. The H200 image holds
# transformers, timm and torchvision already (/work/.library/device/KINDS.md, "Python packages
# already there"), so this is only needed if a later image drops them. Run here, in the repo root:
#   bash benchmarks/zoo_wheels.sh            # -> .whl/ (git-ignored through .git/info/exclude)
# then name `.whl` in the device call's carry and start its command with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit;
# (torchvision is left out: its wheel is tied to the torch build there; it is in the image.)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl transformers timm tokenizers safetensors huggingface_hub hf-xet
ls -la .whl
