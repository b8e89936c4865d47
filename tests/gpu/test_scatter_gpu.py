"""The compiler's row scatter-add kernel (``kernelab/compiler/scatter.py``) on a CUDA GPU, where
its atomic adds from many programs meet in L2 (the interpreter runs programs one at a time).

Run on a GPU machine WITHOUT TRITON_INTERPRET: ``python -m pytest tests/gpu -q``."""
import pytest
import torch
import torch.nn.functional as F

from kernelab.compiler.group_runner import interpreted
from kernelab.compiler.scatter import ScatterAddRows

pytestmark = pytest.mark.skipif(interpreted() or not torch.cuda.is_available(),
                                reason="atomic adds of many programs at once need a CUDA GPU")


@pytest.mark.parametrize("rows, n_idx, width", [
    (1, 8192, 768),  # BERT's token types: every index the same row
    (512, 8192, 768),  # position ids: 16 rows each
    (30522, 8192, 768),  # word ids
    (7, 1000, 3000),  # wider than one column block, an odd width
])
def test_scatter_add_matches_aten(rows, n_idx, width):
    gen = torch.Generator(device="cuda").manual_seed(0)
    idx = torch.randint(0, rows, (n_idx,), device="cuda", generator=gen)
    values = torch.randn(n_idx, width, device="cuda", generator=gen)
    out = ScatterAddRows()(torch.zeros(rows, width, device="cuda"), [idx], values, True)
    ref = torch.zeros(rows, width, device="cuda", dtype=torch.float64).index_put_((idx,), values.double(), True)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-4 * n_idx ** 0.5)


def test_compiled_embedding_backward_matches_eager_in_bf16():
    """An embedding's weight gradient under the backend, bf16, with ids repeated 8192 times."""
    w = torch.randn(2, 768, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    ids = torch.zeros(16, 512, dtype=torch.long, device="cuda")
    ids[:, 256:] = 1
    dy = torch.randn(16, 512, 768, device="cuda", dtype=torch.bfloat16)

    def step(w):
        return (F.embedding(ids, w).float() * dy.float()).sum()

    ref = torch.autograd.grad(step(w), w)[0].float()
    got = torch.autograd.grad(torch.compile(step, backend="kernelab")(w), w)[0].float()
    torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())
