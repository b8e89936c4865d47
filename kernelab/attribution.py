"""Which nn.Module and which line of user code each op (and so each kernel) comes from.

Capture asks an :class:`Attributor` for the :class:`Site` of every op it records:

* *forward ops*: the innermost module whose ``forward`` is running (global forward pre/post hooks
  keep a stack of module paths) and the innermost stack frame in user code (not torch, not
  kernelab, not the standard library);
* *backward ops*: the site of the forward op they differentiate. After each top-level torch call
  (a TorchFunctionMode sees them) the autograd nodes it created are tagged with its site; the
  autograd engine runs each backward op inside one node (``torch._C._current_autograd_node()``),
  whose tag is the answer. A node no torch call created (a custom autograd Function) is tagged
  when its module returns.

Paths are ``named_modules()`` names relative to the counted module (``""`` is the module itself);
a module the target reaches through a variable (``lambda x: model(x)``) is named by that variable.

Compiled modes: Inductor's predicted kernels list every module of the ops they fuse (see
``inductor_model``); kernelab's plan does not carry module metadata yet, so :func:`align_modules`
gives its kernels the modules of the eager kernels they replace, aligned in launch order.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

from .module_tree import ROOT, join


@dataclass(frozen=True)
class Site:
    """Where an op comes from: the module path that ran it and the user's source line."""

    module: str | None = ROOT  # None: not tracked
    source: str = ""  # "path/to/file.py:42" ("" when no user frame was on the stack)


def unique(items) -> list:
    return list(dict.fromkeys(items))


# ---------------------------------------------------------------------------------------------
# Source lines


def _library_dirs() -> tuple[str, ...]:
    import kernelab

    dirs = [os.path.dirname(torch.__file__), os.path.dirname(kernelab.__file__)]
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs)


# Code without a file that is not the user's: frozen stdlib modules, FX-generated forwards.
# ("<stdin>", "<string>" and notebook cells are the user's.)
_GENERATED = ("<frozen", "<eval_with_key")


class SourceFinder:
    """The innermost stack frame in user code, as ``file:line``; a file is classified once.

    Not user code: torch, kernelab, and the standard library (but packages installed beside it,
    such as transformers, hold the user's models)."""

    def __init__(self):
        self.library = _library_dirs()
        self.stdlib = os.path.join(os.path.realpath(os.path.dirname(os.__file__)), "")
        self.is_user: dict[str, bool] = {}

    def user_file(self, filename: str) -> bool:
        known = self.is_user.get(filename)
        if known is None:
            path = os.path.realpath(filename)
            stdlib = path.startswith(self.stdlib) and "-packages" + os.sep not in path
            known = not (filename.startswith(_GENERATED) or path.startswith(self.library) or stdlib)
            self.is_user[filename] = known
        return known

    def frame(self):
        frame = sys._getframe(1)
        while frame is not None and not self.user_file(frame.f_code.co_filename):
            frame = frame.f_back
        return frame

    def source(self) -> str:
        frame = self.frame()
        return "" if frame is None else f"{_short_path(frame.f_code.co_filename)}:{frame.f_lineno}"


def _short_path(filename: str) -> str:
    """Relative to the working directory when inside it, else as Python named it."""
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith("..") else rel


def source_line(source: str) -> int | None:
    """``"model.py:42"`` -> 42."""
    _, _, line = source.rpartition(":")
    return int(line) if line.isdigit() else None


# ---------------------------------------------------------------------------------------------
# Module paths and autograd tags


class _TagNewNodes(TorchFunctionMode):
    """After each top-level torch call, tag the autograd nodes it created with its site."""

    def __init__(self, attributor: "Attributor"):
        super().__init__()
        self.attributor = attributor

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.attributor.tag_graph(out)
        return out


class Attributor:
    """Global module hooks, autograd tags and the source finder, active inside ``with``."""

    def __init__(self, root: torch.nn.Module | None = None):
        self.paths: dict[int, str] = {}  # id(module) -> path
        self.types: dict[str, str] = {}  # path -> class name
        self.alive: list = []  # modules named here stay alive, so their ids are not reused
        self.stack: list[tuple[int, str]] = []  # (id(module), path) of the forwards running
        self.tags: dict = {}  # autograd node -> Site of the forward call that created it
        self.sources = SourceFinder()
        self.handles: list = []
        self.function_mode = _TagNewNodes(self)
        if root is not None:
            self.name(root, ROOT)

    # -- naming ------------------------------------------------------------------------------
    def name(self, module: torch.nn.Module, prefix: str) -> str:
        for child_name, child in module.named_modules(remove_duplicate=False):
            if id(child) not in self.paths:
                path = join(prefix, child_name)
                self.paths[id(child)] = path
                self.types[path] = type(child).__name__
                self.alive.append(child)
        return self.paths[id(module)]

    def path_of(self, module: torch.nn.Module) -> str:
        known = self.paths.get(id(module))
        if known is not None:
            return known
        if self.stack:  # a module its parent did not register (built inside forward)
            return self.name(module, join(self.stack[-1][1], type(module).__name__))
        return self.name(module, self.variable_name(module))

    def variable_name(self, module: torch.nn.Module) -> str:
        """The name the user's code calls the module by (``model`` in ``model(x)``), else its class."""
        frame = self.sources.frame()
        for scope in (frame.f_locals, frame.f_globals) if frame is not None else ():
            for var, value in scope.items():
                if value is module and not var.startswith("_"):
                    return var
        return type(module).__name__

    # -- the running module ------------------------------------------------------------------
    def pre_hook(self, module, args) -> None:
        self.stack.append((id(module), self.path_of(module)))

    def post_hook(self, module, args, output) -> None:
        ids = [i for i, _ in self.stack]
        if id(module) not in ids:
            return
        self.tag_graph(output)  # nodes no torch call tagged (custom autograd Functions)
        del self.stack[len(ids) - 1 - ids[::-1].index(id(module)):]

    def current(self) -> str:
        return self.stack[-1][1] if self.stack else ROOT

    # -- autograd ----------------------------------------------------------------------------
    def tag_graph(self, out) -> None:
        """Tag every untagged node reachable from ``out``'s grad_fns: the nodes the call created
        (the walk stops at nodes tagged by earlier calls, so each node is visited once)."""
        stack = [t.grad_fn for t in _tensors(out) if t.grad_fn is not None]
        site = None
        while stack:
            node = stack.pop()
            if node is None or node in self.tags:
                continue
            site = site or Site(self.current(), self.sources.source())
            self.tags[node] = site
            stack.extend(next_node for next_node, _ in node.next_functions)

    def site(self) -> Site:
        """The site of the op being recorded now."""
        node = torch._C._current_autograd_node()
        if node is not None:
            tagged = self.tags.get(node)
            if tagged is not None:
                return tagged
        return Site(self.current(), self.sources.source())

    # -- context -----------------------------------------------------------------------------
    def __enter__(self) -> "Attributor":
        from torch.nn.modules import module as nn_module

        self.handles = [nn_module.register_module_forward_pre_hook(self.pre_hook),
                        nn_module.register_module_forward_hook(self.post_hook, always_call=True)]
        self.function_mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.function_mode.__exit__(*exc)
        for handle in self.handles:
            handle.remove()
        self.handles = []


def _tensors(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for t in out if isinstance(t, torch.Tensor)]
    if isinstance(out, dict):
        return [t for t in out.values() if isinstance(t, torch.Tensor)]
    out = getattr(out, "to_tuple", None)  # Hugging Face ModelOutput
    return _tensors(out()) if callable(out) else []


# ---------------------------------------------------------------------------------------------
# Compiled graphs and compiled modes


def fx_site(nodes) -> tuple[list[str], str]:
    """(module paths, source) of FX nodes from their metadata: ``nn_module_stack`` (forward) or
    ``fwd_nn_module_stack`` (backward nodes, copied by aot_autograd) and ``stack_trace``. For a
    compiler that knows which nodes a kernel covers; paths as capture names them (dynamo's
    ``L['self'].layers[3]`` becomes ``layers.3``; a node outside every submodule is the target's)."""
    modules, source = [], ""
    for node in nodes:
        stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}
        modules.append(_dynamo_path(list(stack.values())[-1][0]) if stack else ROOT)
        if not source and node.meta.get("stack_trace"):
            source = _last_frame(node.meta["stack_trace"])
    return unique(modules), source


def _dynamo_path(qualified: str) -> str:
    """``L['self'].layers[3].mlp`` -> ``layers.3.mlp``; ``L['model'].fc1`` (a module the function
    reaches by a variable) -> ``model.fc1``."""
    import re

    text = re.sub(r"^L\['self'\]", "", qualified)
    text = re.sub(r"^[LG]\['([^']*)'\]", r"\1", text)
    text = re.sub(r"\[(?:'([^']*)'|(\d+))\]", lambda m: "." + (m.group(1) or m.group(2)), text)
    return text.replace("._modules.", ".").strip(".")


def _last_frame(stack_trace: str) -> str:
    """The innermost ``File "x.py", line 42`` of an FX stack trace, as ``x.py:42``."""
    import re

    frames = re.findall(r'File "([^"]+)", line (\d+)', stack_trace)
    return f"{_short_path(frames[-1][0])}:{frames[-1][1]}" if frames else ""


def align_modules(specs: list, reference: list) -> None:
    """Give kernels without modules (kernelab's plan) those of the eager kernels they replace.

    Library kernels (GEMMs, attention, ops left to ATen) carry the same names in both lists and
    pair exactly; a run of generated kernels between two pairs takes, in order, the modules of the
    eager kernels between the same pairs (each a proportional slice of that run), so a fused
    kernel lists every module of the eager kernels it stands for.
    """
    import difflib

    if not reference or all(s.modules for s in specs):
        return
    matcher = difflib.SequenceMatcher(None, [s.name for s in specs], [r.name for r in reference], autojunk=False)
    for tag, a0, a1, b0, b1 in matcher.get_opcodes():
        for i in range(a0, a1):
            if specs[i].modules:
                continue
            if tag == "equal":
                _copy_site(specs[i], [reference[b0 + i - a0]])
            elif b1 > b0:  # a proportional slice of the eager run this compiled run replaces
                lo = b0 + (i - a0) * (b1 - b0) // (a1 - a0)
                hi = max(b0 + -(-(i - a0 + 1) * (b1 - b0) // (a1 - a0)), lo + 1)
                _copy_site(specs[i], reference[lo:hi])
            else:  # nothing eager in between: the neighbour's
                _copy_site(specs[i], [reference[min(b0, len(reference) - 1)]])


def _copy_site(spec, sources: list) -> None:
    spec.modules = unique(m for s in sources for m in s.modules)
    spec.source = next((s.source for s in sources if s.source), "")
    spec.backward = spec.backward or all(s.backward for s in sources)
