import os

import pytest
import torch


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """Ceilings and other caches go to a temporary folder, never the user's home."""
    monkeypatch.setenv("KERNELAB_CACHE", str(tmp_path / "cache"))


requires_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture
def built_runners(monkeypatch):
    """The compiler's GraphRunners built during the test, in order (``runtime.GraphRunner``)."""
    from kernelab.compiler import runtime

    made = []
    original = runtime.GraphRunner.__post_init__

    def post_init(self):
        original(self)
        made.append(self)

    monkeypatch.setattr(runtime.GraphRunner, "__post_init__", post_init)
    return made
