"""What the GPU tuning scripts share: their command line (one output directory) and the GPU check."""

from __future__ import annotations

import argparse
from pathlib import Path


def gpu_out_dir(doc: str) -> Path:
    """Parse ``SCRIPT OUT``; exit 2 with one line when no CUDA GPU is present; create OUT."""
    import torch

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("out", type=Path, help="directory for the CSV (and text) results")
    out = ap.parse_args().out
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (it times kernels)")
    out.mkdir(parents=True, exist_ok=True)
    return out
