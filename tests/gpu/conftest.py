"""The GPU tests run the compiled kernels, never Triton's interpreter: on a machine with a CUDA GPU a
test fails where TRITON_INTERPRET is set (an import of ``tests/compiler/conftest.py``, which sets
it, once made every GPU test after it run interpreted, and fail, in a run of several files).
Without a GPU (CI) the tests skip themselves and this checks nothing."""
import os

import pytest
import torch


@pytest.fixture(autouse=True)
def _compiled_kernels():
    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.fail("TRITON_INTERPRET is set: the GPU tests would run Triton's interpreter")
