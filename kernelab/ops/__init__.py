"""Fused Triton kernels, each a drop-in for its ``torch.nn.functional`` counterpart, with autograd.

Every op is also a ``torch.library`` custom op (``torch.ops.kernelab.*``) with a fake
implementation, so it traces under ``torch.compile(fullgraph=True)`` and ``kernelab.count``.
Without CUDA and without ``TRITON_INTERPRET=1`` the ops run their PyTorch reference (said once).
"""

from .cross_entropy import cross_entropy
from .linear import linear, swiglu_linear
from .linear_cross_entropy import linear_cross_entropy
from .norms import layer_norm, rms_norm
from .pointwise import add_relu, bias_gelu, gelu_mul, silu_mul
from .softmax import log_softmax, softmax

__all__ = [
    "add_relu",
    "bias_gelu",
    "silu_mul",
    "gelu_mul",
    "softmax",
    "log_softmax",
    "layer_norm",
    "rms_norm",
    "cross_entropy",
    "linear_cross_entropy",
    "linear",
    "swiglu_linear",
]
