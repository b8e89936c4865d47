"""Input builders shared by the kernelab.ops tests."""

import torch


def randn(shape, dtype, *, scale=1.0, shift=0.0, grad=True, seed=0, noncontig=False):
    """Fresh random input (float64 master copy rounded to ``dtype``); optionally non-contiguous
    (a transposed, sliced view holding the same values)."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * scale + shift).to(dtype)
    if noncontig and len(shape) >= 1:
        # same logical values, last-dim stride 2 and a permuted leading layout
        big = torch.zeros(*shape[:-1], 2 * shape[-1], dtype=dtype)
        big[..., ::2] = x
        x = big[..., ::2]
        assert not x.is_contiguous() or x.numel() <= 1
    return x.requires_grad_(grad)


def ref_copy(x):
    """float64 leaf with the same values, for the reference computation."""
    if x is None:
        return None
    return x.detach().double().requires_grad_(x.requires_grad)
