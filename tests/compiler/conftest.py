"""Shared helpers of the compiler tests: the interpreter, a fresh dynamo per test, tolerances.

The generated kernels run under Triton's interpreter on CPU tensors (TRITON_INTERPRET=1 must be set
before Triton is imported; this file sets it when the run did not).
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.utils import _pytree as pytree  # noqa: E402

# (the comparisons live where GPU tests can import them without this file's TRITON_INTERPRET)
from tests.closeness import ABS, REL, TOLERANCE, assert_close, gradients_off, rel_norm  # noqa: E402,F401


def pytest_configure(config):
    # the interpreter evaluates masked-out lanes too (exp(-inf + inf), log(0)): numpy complains
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning")


@pytest.fixture(autouse=True)
def _strict(monkeypatch):
    """A compiler error fails the test instead of quietly falling back to ATen."""
    monkeypatch.setenv("KERNELAB_STRICT", "1")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Every test compiles from scratch: no graph cached by an earlier test answers for it."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def _interpreted():
    from kernelab.compiler.runtime import interpreted

    if not interpreted():
        pytest.fail("triton was imported before TRITON_INTERPRET=1 was set: the tests would only see the fallback")


def tensors(tree) -> list:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


