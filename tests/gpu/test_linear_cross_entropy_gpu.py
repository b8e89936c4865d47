"""linear_cross_entropy's vocabulary-chunked path on a CUDA GPU in bfloat16: dhidden accumulates
in float32 through cuBLAS's mixed-dtype matmul (``torch.mm(..., out_dtype=torch.float32)`` and
``torch.addmm(acc, ..., out_dtype=torch.float32, out=acc)``), which exists on CUDA only; the
interpreter's CPU tests upcast instead. Skipped without a GPU (CI)."""

import pytest
import torch
import torch.nn.functional as F

from kernelab import ops as K
from kernelab.ops import _common

pytestmark = pytest.mark.skipif(
    _common.INTERPRETED or not torch.cuda.is_available(), reason="needs a CUDA GPU, without the interpreter"
)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("n,h,v,rows,cols", [(1000, 256, 5000, None, 1024), (777, 192, 3001, 200, 640),
                                             (4096, 512, 32000, None, None)], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_vocabulary_chunks_bf16(n, h, v, rows, cols, reduction):
    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn((n, h), generator=gen, device="cuda").bfloat16().requires_grad_()
    weight = (torch.randn((v, h), generator=gen, device="cuda") * h ** -0.5).bfloat16().requires_grad_()
    target = torch.randint(0, v, (n,), generator=gen, device="cuda")
    target[::7] = -100
    loss = K.linear_cross_entropy(hidden, weight, target, reduction=reduction, chunk_rows=rows, vocab_chunk=cols,
                                  label_smoothing=0.1)
    g = torch.rand_like(loss) if reduction == "none" else torch.tensor(1.0, device="cuda")
    dh, dw = torch.autograd.grad(loss, (hidden, weight), g)
    hr, wr = hidden.detach().float().requires_grad_(), weight.detach().float().requires_grad_()
    ref = F.cross_entropy(hr @ wr.t(), target, reduction=reduction, label_smoothing=0.1)
    rdh, rdw = torch.autograd.grad(ref, (hr, wr), g)
    assert rel(loss, ref) < 1e-2
    assert rel(dh, rdh) < 2e-2 and rel(dw, rdw) < 2e-2
    assert dh.dtype == dw.dtype == torch.bfloat16
