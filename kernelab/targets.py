"""Put a user's target (a function or an nn.Module) and its arguments on a device for a real run.

Tensors are moved *exactly as built*: the whole storage travels and the tensor is re-viewed into it
with the same size, stride and storage offset. A plain ``x.to(device)`` would make a sliced input
(``x[:, ::2]``) contiguous on the device and so measure a different program; moving the storage also
keeps two arguments that alias one storage aliased on the device.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["PreparedTarget", "prepare_on_device", "compiles_every_time"]


@dataclass
class PreparedTarget:
    """A target and its arguments on one device, ready to be called repeatedly."""

    fn: Callable[..., Any]               # the function, or the moved copy of the module
    args: tuple                          # moved arguments (same pytree structure)
    device: Any
    module: Any = None                   # the moved module when the target was one
    leaves_requiring_grad: list = field(default_factory=list)  # inputs and params that get .grad

    def __call__(self) -> Any:
        return self.fn(*self.args)

    def reset_grads(self) -> None:
        """Drop every .grad, so each call starts fresh.

        Without this the second call's backward finds .grad already set and accumulates into it
        (an extra read-modify-write add kernel per parameter) instead of stealing the gradient
        buffer; every call must launch what the first one did.
        """
        for leaf in self.leaves_requiring_grad:
            leaf.grad = None


def _move_tensor(x, device, moved_storages: dict, requires_grad: bool):
    """`x` on `device` with the same size/stride/offset; storages shared between args stay shared."""
    import torch

    storage = x.untyped_storage()
    key = (storage.data_ptr(), storage.nbytes(), x.device)
    dev_storage = moved_storages.get(key)
    if dev_storage is None:
        raw = torch.empty(0, dtype=torch.uint8, device=x.device)
        with torch.no_grad():
            raw.set_(storage)                                       # the bytes, as one flat view
            dev_storage = raw.to(device, copy=True).untyped_storage()  # never alias the caller
        moved_storages[key] = dev_storage
    out = torch.empty(0, dtype=x.dtype, device=device)
    with torch.no_grad():
        out.set_(dev_storage, x.storage_offset(), x.size(), x.stride())
    return out.requires_grad_(requires_grad)


def _move_args(args: tuple, device) -> tuple:
    import torch
    from torch.utils import _pytree as pytree

    moved_storages: dict = {}

    def move(leaf):
        if isinstance(leaf, torch.Tensor):
            return _move_tensor(leaf.detach(), device, moved_storages, leaf.requires_grad)
        return leaf

    return tuple(pytree.tree_map(move, list(args)))


def _tensor_leaves(args: tuple) -> list:
    import torch
    from torch.utils import _pytree as pytree

    return [x for x in pytree.tree_leaves(list(args)) if isinstance(x, torch.Tensor)]


def prepare_on_device(target: Any, args: Any, device: Any) -> PreparedTarget:
    """Copy `target` (function or nn.Module) and `args` to `device`.

    Tensors are detached copies that keep ``requires_grad``; an nn.Module is deep-copied and moved
    (its parameters keep ``requires_grad``); nested tuples/lists/dicts are walked as pytrees.
    """
    import torch

    if isinstance(args, list):
        args = tuple(args)
    if not isinstance(args, tuple):
        raise ValueError(f"args must be a tuple of positional arguments, got {type(args).__name__}")
    if not callable(target):
        raise ValueError(f"target must be a function or an nn.Module, got {type(target).__name__} (not callable)")
    device = torch.device(device)
    moved_args = _move_args(args, device)
    module = None
    if isinstance(target, torch.nn.Module):
        module = copy.deepcopy(target).to(device)
        fn = module
    else:
        fn = target
    leaves = [x for x in _tensor_leaves(moved_args) if x.requires_grad]
    if module is not None:
        leaves += [p for p in module.parameters() if p.requires_grad]
    return PreparedTarget(fn=fn, args=moved_args, device=device, module=module,
                          leaves_requiring_grad=leaves)


#: How many compilations of one function dynamo keeps while kernelab counts or measures it.
COUNTING_RECOMPILE_LIMIT = 4096


@contextlib.contextmanager
def compiles_every_time():
    """While kernelab compiles a user's target to count or measure it: dynamo never runs a frame
    eagerly because it hit its recompile limit. By default, after 8 compilations of one function
    (the same ``step`` counted over 8 models in a process, each a new set of guards) dynamo runs
    that function uncompiled with a logged warning, and a count of mode="kernelab" then reported
    eager's kernels as kernelab's, silently. Here the limits are raised, and reaching them raises."""
    import torch._dynamo

    with torch._dynamo.config.patch(recompile_limit=COUNTING_RECOMPILE_LIMIT,
                                    accumulated_recompile_limit=COUNTING_RECOMPILE_LIMIT,
                                    fail_on_recompile_limit_hit=True):
        yield
