"""linear (matmul + bias + activation + residual) and swiglu_linear (SwiGLU's dual GEMM), forward and backward.

    linear         Y = act(X @ W^T + b) + R          Z = X @ W^T + b kept for the backward (act != none)
                   dZ = dY * act'(Z),  dX = dZ @ W,  dW = dZ^T @ X,  db = sum over rows of dZ,  dR = dY
    swiglu_linear  Y = silu(X @ Wg^T) * (X @ Wu^T)   G = X @ Wg^T, U = X @ Wu^T kept for the backward
                   dG = dY * U * silu'(G),  dU = dY * silu(G)
                   dX = dG @ Wg + dU @ Wu (the second GEMM adds the first as its residual)
                   dWg = dG^T @ X,  dWu = dU^T @ X

X is [..., K], W [N, K] (F.linear's layout). The forward is one GEMM kernel (``gemm.py``) whose
epilogue applies bias, activation and residual to the float32 accumulator: Y written once, where
eager PyTorch writes X @ W^T + b and reads it back for the activation and again for the residual.
The backward applies act' once (one pointwise kernel, which also reduces db per program), then
runs dX and dW on transposed views (no copies) as plain products: nothing is left to fuse there,
so ``gemm.PLAIN_PRODUCTS`` picks cuBLAS (default) or the same GEMM kernel.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from ..errors import KernelabError
from . import _common, gemm

#: activation name -> its PyTorch function: the fallback, and what double backward differentiates.
ACTIVATIONS = {
    "none": lambda z: z,
    "relu": torch.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
    "silu": F.silu,
}


# --------------------------------------------------------------------------- launchers
def _nothing(x: torch.Tensor) -> torch.Tensor:
    """A fresh empty tensor for an output that is not computed (custom op outputs never alias);
    fake tensors too (the fake implementations)."""
    return x.new_empty((0,))


def _no_output(x: torch.Tensor) -> torch.Tensor:
    """``_nothing`` for the launchers (real tensors): through ``_common.empty``, cheaper."""
    return _common.empty((0,), x.dtype, x.device)


def _flat(t: torch.Tensor, width: int) -> torch.Tensor:
    """``t`` [..., width] as [M, width] rows (``as_rows``; also for width 0, where -1 is ambiguous)."""
    return _common.as_rows(t, width) if width else t.new_empty((_rows(t), 0))


def _linear_forward(x, weight, bias, residual, activation: str, save_z: bool):
    """(Y [..., N], Z [M, N] or an empty tensor)."""
    n, k = weight.shape
    x2 = _flat(x, k)
    res2 = _flat(residual, n) if residual is not None else None
    act = gemm.code_for(activation, x.dtype)
    store_z = save_z and activation != "none"
    y, z, _ = gemm.gemm(x2, weight, bias=bias, residual=res2, act=act, store_z=store_z)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], n), z if store_z else _no_output(x)


def _linear_backward(dy, x, weight, z, activation: str, has_bias: bool, needs: list[bool]):
    """(dX, dW, db): empty tensors for those not in ``needs`` (and db without a bias)."""
    n, k = weight.shape
    dy2 = _flat(dy, n)
    act = gemm.code_for(activation, x.dtype)
    dz, _, db = gemm.activation_backward(dy2, z if activation != "none" else None, act, has_bias and needs[2])
    dx = gemm.plain(dz, weight.t()).view(x.shape) if needs[0] else _no_output(x)
    dw = gemm.plain(dz.t(), _flat(x, k).t()) if needs[1] else _no_output(x)
    return dx, dw, db if db is not None else _no_output(x)


def _swiglu_forward(x, w_gate, w_up, save: bool):
    """(Y [..., N], G, U): G and U [M, N] when ``save``, else empty tensors."""
    n, k = w_gate.shape
    y, g, u = gemm.gemm(_flat(x, k), w_gate, b2=w_up, store_z=save)
    return y.view(*x.shape[:-1], n), g if save else _no_output(x), u if save else _no_output(x)


def _swiglu_backward(dy, x, w_gate, w_up, g, u, needs: list[bool]):
    """(dX, dWg, dWu): empty tensors for those not in ``needs``."""
    n, k = w_gate.shape
    dg, du, _ = gemm.activation_backward(_flat(dy, n), g, gemm.NONE.value, False, u=u)
    x2 = _flat(x, k)
    dx = _no_output(x)
    if needs[0]:
        dx = gemm.plain(du, w_up.t(), residual=gemm.plain(dg, w_gate.t())).view(x.shape)
    dwg = gemm.plain(dg.t(), x2.t()) if needs[1] else _no_output(x)
    dwu = gemm.plain(du.t(), x2.t()) if needs[2] else _no_output(x)
    return dx, dwg, dwu


# --------------------------------------------------------------------------- custom ops and autograd
def _rows(x: torch.Tensor) -> int:
    return math.prod(x.shape[:-1])


@torch.library.custom_op("kernelab::linear", mutates_args=())
def _linear_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], residual: Optional[torch.Tensor],
               activation: str, save_z: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _linear_forward(x, weight, bias, residual, activation, save_z)


@_linear_op.register_fake
def _(x, weight, bias, residual, activation, save_z):
    n = weight.shape[0]
    z_shape = (_rows(x), n) if save_z and activation != "none" else (0,)
    return x.new_empty((*x.shape[:-1], n)), x.new_empty(z_shape)


@torch.library.custom_op("kernelab::linear_backward", mutates_args=())
def _linear_backward_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, z: torch.Tensor, activation: str,
                        has_bias: bool, needs: list[bool]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _linear_backward(dy, x, weight, z, activation, has_bias, needs)


@_linear_backward_op.register_fake
def _(dy, x, weight, z, activation, has_bias, needs):
    return (x.new_empty(x.shape) if needs[0] else _nothing(x), weight.new_empty(weight.shape) if needs[1] else _nothing(x),
            weight.new_empty(weight.shape[:1]) if has_bias and needs[2] else _nothing(x))


def _linear_setup(ctx, inputs, output):
    x, weight, bias, residual, activation, save_z = inputs
    ctx.activation, ctx.has_bias = activation, bias is not None
    ctx.save_for_backward(x, weight, bias, output[1])
    ctx.set_materialize_grads(False)  # Z's gradient is never used: no zero-filled tensor for it


def _linear_grads(ctx, dy, _dz):
    x, weight, bias, z = ctx.saved_tensors
    needs = list(ctx.needs_input_grad[:4])
    if dy is None:
        return None, None, None, None, None, None
    dres = dy if needs[3] else None
    if not any(needs[:3]):  # only the residual wants a gradient: z was not kept (nothing to read)
        return None, None, None, dres, None, None
    if _common.builds_graph():  # double backward: PyTorch's differentiable gradients
        def reference(x, weight, bias):
            return ACTIVATIONS[ctx.activation](F.linear(x, weight, bias))

        grads = _common.reference_grads(reference, (x, weight, bias), needs[:3], dy)
        return (*grads, dres, None, None)
    dx, dw, db = _common.call(_linear_backward_op, _linear_backward, dy, x, weight, z, ctx.activation, ctx.has_bias,
                              needs[:3])
    return dx if needs[0] else None, dw if needs[1] else None, db if needs[2] else None, dres, None, None


_linear_op.register_autograd(_linear_grads, setup_context=_linear_setup)
_Linear = _common.eager_function("_Linear", _linear_forward, _linear_setup, _linear_grads)


@torch.library.custom_op("kernelab::swiglu_linear", mutates_args=())
def _swiglu_op(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
               save: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _swiglu_forward(x, w_gate, w_up, save)


@_swiglu_op.register_fake
def _(x, w_gate, w_up, save):
    saved = (_rows(x), w_gate.shape[0]) if save else (0,)
    return x.new_empty((*x.shape[:-1], w_gate.shape[0])), x.new_empty(saved), x.new_empty(saved)


@torch.library.custom_op("kernelab::swiglu_linear_backward", mutates_args=())
def _swiglu_backward_op(dy: torch.Tensor, x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, g: torch.Tensor,
                        u: torch.Tensor, needs: list[bool]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _swiglu_backward(dy, x, w_gate, w_up, g, u, needs)


@_swiglu_backward_op.register_fake
def _(dy, x, w_gate, w_up, g, u, needs):
    return (x.new_empty(x.shape) if needs[0] else _nothing(x), w_gate.new_empty(w_gate.shape) if needs[1] else _nothing(x),
            w_up.new_empty(w_up.shape) if needs[2] else _nothing(x))


def _swiglu_setup(ctx, inputs, output):
    x, w_gate, w_up, save = inputs
    ctx.save_for_backward(x, w_gate, w_up, output[1], output[2])
    ctx.set_materialize_grads(False)


def _swiglu_grads(ctx, dy, _dg, _du):
    x, w_gate, w_up, g, u = ctx.saved_tensors
    needs = list(ctx.needs_input_grad[:3])
    if dy is None:
        return None, None, None, None
    if _common.builds_graph():
        grads = _common.reference_grads(_swiglu_reference, (x, w_gate, w_up), needs, dy)
        return (*grads, None)
    grads = _common.call(_swiglu_backward_op, _swiglu_backward, dy, x, w_gate, w_up, g, u, needs)
    return (*(grad if need else None for grad, need in zip(grads, needs)), None)


def _swiglu_reference(x, w_gate, w_up):
    return F.silu(F.linear(x, w_gate)) * F.linear(x, w_up)


_swiglu_op.register_autograd(_swiglu_grads, setup_context=_swiglu_setup)
_Swiglu = _common.eager_function("_Swiglu", _swiglu_forward, _swiglu_setup, _swiglu_grads)


# --------------------------------------------------------------------------- public functions
def _check_same(what: str, x: torch.Tensor, **others) -> None:
    """Every tensor in ``others`` has x's dtype and device (one clear line otherwise)."""
    for name, t in others.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise KernelabError(f"{what}: {name} must be a Tensor, not {type(t).__name__}")
        if t.dtype != x.dtype:
            raise KernelabError(f"{what}: {name} is {t.dtype} but x is {x.dtype} (cast one of them)")
        if t.device != x.device:
            raise KernelabError(f"{what}: {name} is on {t.device} but x is on {x.device}")


def _check_weight(what: str, name: str, x: torch.Tensor, weight: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise KernelabError(f"{what}: x must be a Tensor, not {type(x).__name__}")
    if x.dim() < 1 or not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        got = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise KernelabError(f"{what}: needs x of shape (..., K) and {name} of shape (N, K), got x {tuple(x.shape)} and {got}")
    if x.shape[-1] != weight.shape[1]:
        raise KernelabError(f"{what}: x's last dimension is {x.shape[-1]} but {name} is {tuple(weight.shape)} "
                            f"(expected ({weight.shape[0]}, {x.shape[-1]}))")


def _check_linear(x, weight, bias, residual, activation) -> str:
    """The activation's name ("none" for None) after checking every argument."""
    name = "none" if activation is None else activation
    if name not in ACTIVATIONS:
        raise KernelabError(f"linear: unsupported activation {activation!r}; choose one of None, "
                            + ", ".join(repr(a) for a in ACTIVATIONS if a != "none"))
    _check_weight("linear", "weight", x, weight)
    _check_same("linear", x, weight=weight, bias=bias, residual=residual)
    n = weight.shape[0]
    if bias is not None and tuple(bias.shape) != (n,):
        raise KernelabError(f"linear: bias has shape {tuple(bias.shape)}, expected ({n},)")
    if residual is not None and tuple(residual.shape) != (*x.shape[:-1], n):
        raise KernelabError(f"linear: residual has shape {tuple(residual.shape)}, expected the output's "
                            f"{(*x.shape[:-1], n)}")
    return name


def _wants_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, activation: str | None = None,
           residual: torch.Tensor | None = None) -> torch.Tensor:
    """``act(F.linear(x, weight, bias)) + residual`` in one GEMM kernel (fused epilogue).

    x is [..., K], weight [N, K], bias [N], residual [..., N] (the output's shape); activation is
    None, "relu", "gelu" (erf), "gelu_tanh" or "silu". Inputs share one dtype (float16, bfloat16,
    float32: through tf32 only where ``torch.backends.cuda.matmul.allow_tf32`` is set) and device;
    products accumulate in float32 and round once. Differentiable in every tensor argument: the
    forward keeps the pre-activation for act' when a gradient is needed (one extra [M, N] write).
    """
    name = _check_linear(x, weight, bias, residual, activation)
    if not _common.use_triton(x):
        y = ACTIVATIONS[name](F.linear(x, weight, bias))
        return y + residual if residual is not None else y
    save_z = name != "none" and _wants_grad(x, weight, bias)
    return _common.apply(_Linear, _linear_op, x, weight, bias, residual, name, save_z)[0]


def swiglu_linear(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's ``F.silu(F.linear(x, w_gate)) * F.linear(x, w_up)`` (the Llama/Mistral/Qwen MLP's
    first half) as one dual-GEMM kernel: both products share each tile of x, and neither is
    written unless the backward needs them. w_gate and w_up are [N, K] with the same strides
    (non-matching ones are made contiguous). Backward: one pointwise kernel for dG and dU, then
    the GEMM kernel for dX (two products, the second adding the first) and for dWg, dWu."""
    _check_weight("swiglu_linear", "w_gate", x, w_gate)
    _check_same("swiglu_linear", x, w_gate=w_gate, w_up=w_up)
    if w_up.shape != w_gate.shape:
        raise KernelabError(f"swiglu_linear: w_up has shape {tuple(w_up.shape)} but w_gate {tuple(w_gate.shape)}")
    if not _common.use_triton(x):
        return _swiglu_reference(x, w_gate, w_up)
    if w_up.stride() != w_gate.stride():
        w_gate, w_up = w_gate.contiguous(), w_up.contiguous()
    save = _wants_grad(x, w_gate, w_up)
    return _common.apply(_Swiglu, _swiglu_op, x, w_gate, w_up, save)[0]
