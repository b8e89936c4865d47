# Sourced by the README's two commands: make (once) and activate the project's virtual environment.
# torch is installed first and pinned: an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${KERNELAB_VENV:-$ROOT/.venv}"
# torch 2.14.1 with torchvision 0.29.1: the model zoo needs torchvision, whose wheels do not load
# against torch 2.13.0's CPU build ("operator torchvision::nms does not exist")
TORCH_PIN="${KERNELAB_TORCH:-torch==2.14.1 torchvision==0.29.1}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
STAMP="$VENV/.kernelab-installed"
if [ ! -f "$STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$STAMP" ]; then
    python -m pip install -q --upgrade pip
    # shellcheck disable=SC2086 - two pinned requirements
    # --no-cache-dir: the CUDA build is ~5.5 GB unpacked; a cached copy of its wheels would need
    # as much again, and a CI machine once ran out of disk there (Errno 28 during this install)
    python -c "import torch, torchvision" 2>/dev/null || python -m pip install -q --no-cache-dir $TORCH_PIN
    python -m pip install -q --no-cache-dir -e "$ROOT[dev]"
    touch "$STAMP"
fi
cd "$ROOT"
