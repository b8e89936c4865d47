#!/usr/bin/env python
"""``kernelab bench linear`` from a checkout: ``python3 benchmarks/linear_bench.py OUT_DIR [options]``
(see kernelab/bench/linear.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernelab.bench.linear import script_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(script_main())
