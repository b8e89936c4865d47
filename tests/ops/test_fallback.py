"""Without CUDA and without TRITON_INTERPRET=1 the ops run the PyTorch reference and say so once."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import warnings
    import torch, torch.nn.functional as F
    import kernelab.ops as K
    from kernelab.ops import _common
    assert not _common.INTERPRETED
    x = torch.randn(4, 8, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):
            y = K.softmax(x, -1) + K.layer_norm(x, (8,)) + K.add_relu(x, x) + K.rms_norm(x, (8,))
            loss = K.cross_entropy(x, torch.tensor([1, 2, 3, 4]))
    assert torch.allclose(K.softmax(x, -1), torch.softmax(x, -1))
    assert torch.allclose(loss, F.cross_entropy(x, torch.tensor([1, 2, 3, 4])))
    y.sum().backward()
    assert x.grad is not None
    said = [w for w in caught if issubclass(w.category, _common.KernelabFallbackWarning)]
    assert len(said) == 1, [str(w.message) for w in caught]
    assert "TRITON_INTERPRET" in str(said[0].message)
    compiled = torch.compile(lambda t: K.softmax(t, -1), fullgraph=True, backend="aot_eager")
    assert torch.allclose(compiled(x), torch.softmax(x, -1))
    print("ok")
    """
)


def test_fallback_warns_once_and_matches_reference():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")
