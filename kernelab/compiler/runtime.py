"""Running a partitioned graph: groups launch generated kernels (``group_runner.py``), everything
else runs as ATen, in one generated straight-line function per graph (the host wrapper).

Kernel sources are cached on disk (``kcache.py``); chains of views are replayed as one aliasing
(``views.py``); values around matrix products may get padded rows (``layout.py``).
"""
from __future__ import annotations

import linecache
import sys
import warnings

from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.fx as fx

from .. import config
from ..launch import hooks_set
from . import bounds, fusion, layout, scatter
from .kcache import cache_dir, kernel_module
from .group_runner import GroupRunner, call_node, interpreted, lookup, run_reference
from .tiling import DEFAULT as DEFAULT_TILING, Tiling
from .views import alias, alias_roots, nodes_in, view_chains

__all__ = ["GraphRunner", "kernel_module", "cache_dir", "interpreted", "run_reference"]


# ---------------------------------------------------------------------------------------------
# the whole graph


@dataclass
class GraphRunner:
    """Executes a GraphModule: group launches and ATen calls, in a topological order of the
    groups (a group launches once all its inputs exist). Calls run the generated straight-line
    function; the step-by-step loop serves plan mode (hooks) and any graph it cannot write."""

    gm: fx.GraphModule
    part: object  # graph.Partition
    steps: list  # ("group", GroupRunner) | ("node", fx.Node)
    free_after: list  # per step: nodes whose last use it is
    placeholders: list
    output_args: object
    #: get_attr nodes (tensor literals such as ``torch.tensor(2.0)``, lifted by dynamo as
    #: ``_tensor_constant0``) with their values, fetched once: bound like inputs on every call
    attrs: dict
    #: how many leading outputs the caller may see as views (aot_autograd's user outputs of a
    #: training forward; the rest are tensors saved for the backward, which it detaches anyway);
    #: None: all of them
    visible_outputs: int | None = None
    #: values laid out with padded rows, and returned values copied back (``layout.py``)
    padding: layout.Padding = field(default_factory=layout.Padding)
    #: the runner specialized after the first call (``_specialize``): None until then, or where
    #: nothing could be specialized; ``fast_source`` its text, ``fast_groups`` how many groups it
    #: launches without ``run_values``
    fast: object = None
    fast_source: str = ""
    fast_groups: int = 0
    #: the inputs' layouts at the first call, which the specialized runner checks on every call
    #: (None: not recorded yet; False: no specialization for this graph)
    first_layouts: object = None
    #: ``views.view_chains`` of this runner, made once: the first runner's calls record each
    #: chain's alias, which the specialized runner then writes out (a second set of chains, made
    #: for it, had recorded nothing: every view of every call went through ``ViewChain.__call__``)
    chains: object = None

    @classmethod
    def build(cls, gm: fx.GraphModule, part, interpret: bool, visible_outputs: int | None = None,
              tiling: Tiling | None = None, donated: frozenset = frozenset()) -> "GraphRunner":
        """``donated``: indices of the placeholders whose memory the graph may take at their last
        use (a backward's saved activations that alias nothing else: aot_autograd's
        ``bw_donated_idxs``); kernels may store an output over them, as over the graph's own
        values at their last use (``GroupRunner.reuse``, ``_owned``)."""
        runners = {id(g): GroupRunner(g, interpret, tiling=tiling or DEFAULT_TILING) for g in part.groups}
        steps = _schedule(gm, part, runners)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        attrs = {n: _fetch_attr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"}
        output = next(n for n in gm.graph.nodes if n.op == "output")
        padding = layout.plan(gm, part, layout.visible(output, visible_outputs)) if layout.enabled() else layout.Padding()
        for g in part.groups:
            runners[id(g)].padded = {n: padding.rows[n] for n in g.outputs if n in padding.rows}
        for group, value, buf in part.into.values():  # outputs stored into graph inputs (graph.absorb_copies)
            runners[id(group)].into.append((group.outputs.index(value), buf))
        free_after = _last_uses(steps, output, part)
        _plan_reuse(gm, steps, free_after, set(value_inputs(output, constants=True)),
                    _owned(gm, part, {placeholders[i] for i in donated if i < len(placeholders)}))
        return cls(gm, part, steps, free_after, placeholders, output.args[0], attrs, visible_outputs, padding)

    def __post_init__(self):
        self.source, self.straight = _straight_line(self)

    def __call__(self, args, hooks=None):
        if hooks is None and self.straight is not None:
            if self.fast is not None:
                return self.fast(args)
            if self.first_layouts is None:
                return self._first_call(args)
            return self.straight(args)
        env = dict(zip(self.placeholders, args))
        _release(args)
        for node in self.padding.copies:
            env[node] = layout.padded_copy(env[node], self.padding.rows[node])
        env.update(self.attrs)
        for step, dead in zip(self.steps, self.free_after):
            kind, item = step
            if kind == "group":
                if hooks is not None:
                    hooks.group(item.group, env)
                else:
                    item.run(env)
            elif item in self.part.into:  # its group stored the value into the input
                _, value, buf = self.part.into[item]
                if hooks is not None:
                    hooks.copy_into(env[buf], env[value])
                env[item] = env[buf]
            else:
                target = self.target(item)
                if hooks is not None and isinstance(target, scatter.ScatterAddRows):
                    env[item] = hooks.generated_op(item, env, target.kernel_for)
                else:
                    env[item] = call_node(item, env, target)
            for n in dead:
                env.pop(n, None)
        restore = self.padding.restore
        return list(fx.node.map_arg(self.output_args,
                                    lambda a: layout.traced_layout(lookup(a, env), a) if a in restore else lookup(a, env)))

    def _first_call(self, args):
        """The first call through the straight-line runner, then the runner specialized for the
        inputs' layouts of that call (``_specialize``), where the graph's shapes are fixed."""
        if not (config.fast_runner() and _fixed_shapes(self.gm)):
            self.first_layouts = False
            return self.straight(args)
        layouts = _layouts(args)  # before the call empties the list
        out = self.straight(args)
        self.first_layouts = layouts
        self._specialize()
        return out

    def _specialize(self) -> None:
        """Write each group's one bound launch (``GroupRunner.fast_launch``) into a second
        straight-line runner, which checks the inputs' layouts and the launch hooks once per call
        (else it runs the first runner) and each launch's input alignment (else that group runs
        ``run_values``): ~2-3 Python calls a group instead of ~15."""
        fast = {}
        for runner in self.group_runners:
            spec = runner.fast_launch()
            if spec is not None:
                fast[id(runner)] = spec
        if not fast:
            return
        try:
            source, function = _straight_line(self, fast=fast)
        except Exception as exc:  # a line this writer got wrong: our bug, never the caller's call
            if config.strict():
                raise
            warnings.warn(f"kernelab: a graph's runner could not be specialized ({type(exc).__name__}: {exc}); "
                          "it keeps its first runner (same values, more host time a call)", stacklevel=2)
            return
        if function is not None:
            self.fast, self.fast_source, self.fast_groups = function, source, len(fast)
            if config.debug_level() >= 3:  # 3: the generated sources, this runner's too
                print(f"kernelab: the runner specialized after its first call ({len(fast)} of "
                      f"{len(self.group_runners)} groups launched directly):\n{source}", file=sys.stderr)

    def target(self, node: fx.Node):
        """What runs an ATen node: its op, a product writing into a padded buffer, or the row
        scatter-add kernel (``scatter.py``) for an accumulating ``index_put_``."""
        if scatter.accumulates(node):
            return _SCATTER_ADD_PROVED if _indices_proved(node) else _SCATTER_ADD_ROWS
        stride = self.padding.rows.get(node)
        if stride is not None:
            return layout.PaddedProduct(layout.MATMULS[fusion.target_name(node)], stride)
        widen = self.padding.widen.get(node)
        return node.target if widen is None else layout.WidenedProduct(widen)

    @property
    def group_runners(self):
        return [item for kind, item in self.steps if kind == "group"]

    def for_cuda_graphs(self) -> None:
        """Keep no device memory between calls (recorded into a CUDA graph, whose pool must hold
        only what the graph returns): column reductions' counters are allocated per call. No
        output is stored over an input: the graph's inputs are the trees' static buffers."""
        for group_runner in self.group_runners:
            group_runner.transient_scratch = True
            group_runner.reuse = []
            for call in group_runner.calls.values():
                if call is not None:
                    call.transient, call.counters, call.reuse = True, {}, ()

    def describe_reuse(self) -> list:
        """One line per output a kernel may store over an input at its last use."""
        return [f"{r.group.name} may store {r.group.outputs[i].name} over {r.load_nodes[k].name} (its last use)"
                for r in self.group_runners for i, k in r.reuse]


_SCATTER_ADD_ROWS = scatter.ScatterAddRows()
_SCATTER_ADD_PROVED = scatter.ScatterAddRows(proved=True)


def _indices_proved(node: fx.Node) -> bool:
    """Every index tensor of an ``index_put_`` node proved within its dim of the base (``bounds``)."""
    base, indices = node.args[0], node.args[1]
    sizes = fusion.value(base).shape
    return all(i is None or bounds.within(i, sizes[d]) for d, i in enumerate(indices))


def _direct_target(target):
    """An ATen op overload's C++ entry (what ``OpOverload.__call__`` forwards to): one Python call
    less per ATen op of the runner (~1-2 us on the H200's host)."""
    op = getattr(target, "_op", None) if isinstance(target, torch._ops.OpOverload) else None
    return op if callable(op) else target


def _guard_lines(runner: "GraphRunner", names: dict, bind) -> list:
    """A specialized runner's first lines: every input laid out (or, not a tensor, valued) as at
    the first call, and no launch hook installed; otherwise the call goes to the first runner."""
    slow = f"return {bind('r', runner.straight)}(args)"
    checks, values = [], []
    for p, seen in zip(runner.placeholders, runner.first_layouts):
        if isinstance(seen, _Layout):
            checks.append(f"        {bind('k', assert_layout)}({names[p]}, {bind('c', seen.size)}, {bind('c', seen.stride)})")
        else:
            values.append(f"{names[p]} != {bind('c', seen)}")
    lines = ["    try:", *checks, "    except AssertionError:", f"        {slow}"] if checks else []
    return lines + [f"    if {' or '.join([*values, bind('h', hooks_set) + '()'])}: {slow}"]


class _Layout(NamedTuple):
    size: tuple
    stride: tuple


def _fixed_shapes(gm: fx.GraphModule) -> bool:
    """Every value of the graph has sizes and strides of plain ints (no symbolic or data-dependent
    size): its layouts then follow from its inputs' alone."""
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        for v in (val if isinstance(val, (list, tuple)) else (val,)):
            if isinstance(v, torch.Tensor):
                if not all(type(d) is int for d in (*v.shape, *v.stride())):
                    return False
            elif v is not None and not isinstance(v, (int, float, bool)):
                return False
    return True


def _layouts(args) -> tuple:
    """The inputs' layouts for tensors, the value itself for anything else."""
    return tuple(_Layout(tuple(a.shape), a.stride()) if isinstance(a, torch.Tensor) else a for a in args)


def _fast_group(item: GroupRunner, spec, names: dict, bind, stream: str) -> str:
    """The lines launching a group through its :class:`FastLaunch` (what ``run_values`` does for
    a repeated call, without its lookups): outputs allocated (or taken over inputs, or the graph
    inputs they are stored into), padded ones viewed to their columns, scatter buffers zeroed, the
    bound launcher called; under a check of the inputs the binary assumed 16-byte aligned (the
    graph inputs stored into included), with ``run_values`` for the other case."""
    loads = [names[n] for n in item.load_nodes]
    outs = [names[n] for n in item.group.outputs]
    into = {i: names[buf] for i, (_, buf) in zip(spec.into, item.into)}
    comma = "," if len(outs) == 1 else ""
    if not outs:  # nothing to allocate (a group of no outputs: kept for its launch alone)
        body = []
    elif spec.allocate is not None:
        body = [f"{', '.join(outs)}{comma} = {bind('a', spec.allocate)}([{', '.join(loads)}])"]
        body += [f"{outs[i]} = {buf}" for i, buf in into.items()]
    else:
        empty = bind("e", spec.empty)
        allocs = ", ".join(into[i] if i in into else f"{empty}({bind('c', size)}, {bind('c', stride)}, {bind('c', dtype)})"
                           for i, (size, stride, dtype) in enumerate(spec.outs))
        body = [f"{', '.join(outs)}{comma} = {allocs}{comma}"]
    body += [f"{outs[i]} = {outs[i]}[..., :{cols}]" for i, cols in spec.narrow]
    body += [f"{outs[i]}.zero_()" for i in spec.zeroed]
    lead = [*loads, *outs] + ([f"*{bind('w', spec.scratch)}()"] if spec.scratch is not None else [])
    body.append(_launch_line(spec, lead, len(loads) + len(outs) + (2 if spec.scratch is not None else 0),
                             bind, stream))
    checked = [loads[i] for i in spec.aligned] + [list(into.values())[k] for k in spec.into_aligned]
    if not checked:
        return "\n".join(f"    {line}" for line in body) + f"  # {item.group.name}"
    check = " and ".join(f"{name}.data_ptr() % 16 == 0" for name in checked)
    bufs = f", [{', '.join(into.values())}]" if into else ""
    assign = f"{''.join(o + ', ' for o in outs)}= " if outs else ""  # a group of no outputs assigns nothing
    slow = f"{assign}{bind('g', item)}.run_values([{', '.join(loads)}], []{bufs})"
    return "\n".join([f"    if {check}:  # {item.group.name}", *(f"        {line}" for line in body), "    else:",
                      f"        {slow}"])


def _launch_line(spec, lead: list, tensors: int, bind, stream: str) -> str:
    """The launch of a :class:`FastLaunch`: torch's C++ entry called directly with the binary's
    runtime arguments (``launch.StaticLauncher.runtime_tail``, the constants of the tail left out
    once here rather than filtered per launch), else the launcher's ``launch``. ``lead``: the
    tensor arguments' expressions (a column reduction's scratch as one starred call), ``tensors``
    how many they make."""
    launcher = spec.launcher
    runtime_tail = getattr(launcher, "runtime_tail", None)
    tail = runtime_tail(tensors, spec.tail) if runtime_tail is not None else None
    if tail is None:
        args = lead + ([f"*{bind('c', spec.tail)}"] if spec.tail else [])
        return f"{bind('l', launcher)}.launch({bind('c', spec.grid)}, {stream}, ({', '.join(args)},))"
    args = lead + ([f"*{bind('c', tail)}"] if tail else [])
    grid = ", ".join(str(int(g)) for g in spec.grid)  # three dims (``_DirectLaunch``)
    return (f"{bind('x', launcher.entry)}({bind('c', launcher.function)}, {grid}, {int(launcher.num_warps)}, "
            f"{int(launcher.shared)}, {bind('c', launcher.arg_types)}, ({', '.join(args)},), {stream})")


def _view_line(chain, root: str, bind, fast) -> str:
    """A chain of views: replayed by its ``ViewChain`` (which checks the root's layout per call),
    or, in a specialized runner (``fast``) where the chain recorded its alias, that alias made
    directly from the root (the runner checked the inputs' layouts, which fix the root's)."""
    got = chain.recorded() if fast else None
    if got is None:
        return f"{bind('f', chain)}({root})"
    size, stride, delta, tracked = got
    if tracked:  # a value the caller sees: a view torch knows as one
        return f"{root}.as_strided({bind('c', size)}, {bind('c', stride)}, {root}.storage_offset() + {delta})"
    return f"{bind('u', alias)}({root}, {bind('c', size)}, {bind('c', stride)}, {delta})"


#: ``assert_layout(tensor, size, stride)`` raises AssertionError where the layout differs: Inductor's
#: C++ check (~0.2 us on the CPU) where this torch has it
_ASSERT_LAYOUT = getattr(getattr(torch._C._dynamo, "guards", None), "assert_size_stride", None)


def assert_layout(t: torch.Tensor, size, stride) -> None:
    """Raise AssertionError unless ``t`` has this size and stride."""
    if _ASSERT_LAYOUT is not None:
        _ASSERT_LAYOUT(t, size, stride)
    elif t.shape != size or t.stride() != stride:
        raise AssertionError(f"expected size {tuple(size)} and stride {stride}, got {tuple(t.shape)} and {t.stride()}")


def _straight_line(runner: "GraphRunner", fast: dict | None = None):
    """(source, function): the graph's steps as one generated Python function, or ("", None)
    where an argument cannot be written out (then the step-by-step loop runs it).

    The loop costs a few microseconds of interpretation per step (``map_arg`` over the arguments,
    dead values popped); graphs with dozens of ATen views and matmuls pay that
    on every call. The generated function holds every value in a local, calls each ATen op with
    its arguments written out, launches each group with its input values, replays chains of views
    as one ``as_strided`` (``views.ViewChain``), and deletes each value after its last use, like
    Inductor's wrapper. Targets, constants, group runners and view chains are globals of the
    function (``t3``, ``c7``, ``g2``, ``f5``).

    ``fast`` (GroupRunner id -> ``FastLaunch``): the specialized runner of ``GraphRunner._specialize``,
    whose first lines compare the inputs' layouts with the first call's and look for launch hooks
    (either: the first runner runs the call), and whose groups in ``fast`` launch directly."""
    names = {n: f"v{i}" for i, n in enumerate(runner.gm.graph.nodes)}
    scope: dict = {"lookup": lookup}

    def bind(prefix: str, value) -> str:
        name = f"{prefix}{len(scope)}"
        scope[name] = value
        return name

    def expr(a) -> str:
        if isinstance(a, fx.Node):
            if fusion.is_constant(a) and a not in defined:
                # made here (``lookup``) from the values its shape comes from, if any: a symbolic
                # size (full([s0, 6], 0) under dynamic shapes) is a placeholder or a sym_size node
                made_from = ", ".join(f"{bind('n', p)}: {names[p]}" for p in value_inputs(a))
                return f"lookup({bind('n', a)}, {{{made_from}}})"
            return names[a]
        if isinstance(a, (list, tuple)):
            inner = ", ".join(expr(x) for x in a)
            return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
        if a is None or isinstance(a, (bool, int, str)):
            return repr(a)
        return bind("c", a)

    defined = set(runner.placeholders) | set(runner.attrs)
    for n, value in runner.attrs.items():
        scope[names[n]] = value  # a global of the function: read, never assigned or deleted
    if runner.chains is None:
        runner.chains = view_chains(runner)
    chains, elided = runner.chains
    statements = []  # (line, values it reads, values it defines)
    streams: dict = {}  # device index -> (its stream function, the local holding its stream) (``fast``)
    try:
        for kind, item in runner.steps:
            if kind == "group" and fast and id(item) in fast:
                spec = fast[id(item)]
                stream = streams.setdefault(spec.device_index, (spec.stream_of, f"stream{len(streams)}"))[1]
                reads = [p for n in item.group.nodes for p in value_inputs(n, constants=True)]
                reads += [buf for _, buf in item.into]
                statements.append((_fast_group(item, spec, names, bind, stream), reads, list(item.group.outputs)))
                defined.update(item.group.outputs)
            elif kind == "group":
                g = bind("g", item)
                raw = ", ".join(names[n] for n in item.load_nodes)
                scalars = ", ".join(names[n] for n in item.group.scalars)
                into = f", [{', '.join(names[buf] for _, buf in item.into)}]" if item.into else ""
                outs = "".join(names[n] + ", " for n in item.group.outputs)
                line = (f"    {outs} = {g}.run_values([{raw}], [{scalars}]{into})" if outs
                        else f"    {g}.run_values([{raw}], [{scalars}]{into})") + f"  # {item.group.name}"
                reads = [p for n in item.group.nodes for p in value_inputs(n, constants=True)]
                reads += [buf for _, buf in item.into]
                statements.append((line, reads, list(item.group.outputs)))
                defined.update(item.group.outputs)
            elif item in elided:
                continue
            elif item in runner.part.into:  # its group stored the value into the input: an alias
                buf = runner.part.into[item][2]
                statements.append((f"    {names[item]} = {names[buf]}  # {item.name}: stored by its kernel",
                                   [buf], [item]))
                defined.add(item)
            elif item in chains:
                root, chain = chains[item]
                statements.append((f"    {names[item]} = {_view_line(chain, expr(root), bind, fast)}", [root], [item]))
                defined.add(item)
            else:
                args = [expr(a) for a in item.args] + [f"{k}={expr(v)}" for k, v in item.kwargs.items()]
                target = runner.target(item)
                target = _direct_target(target) if target is item.target else target
                statements.append((f"    {names[item]} = {bind('t', target)}({', '.join(args)})  # {item.name}",
                                   value_inputs(item, constants=True), [item]))
                defined.add(item)
        out = runner.output_args
        if not isinstance(out, (list, tuple)):
            return "", None
        restore = runner.padding.restore

        def returned(a) -> str:
            return f"{bind('r', layout.traced_layout)}({expr(a)}, {bind('n', a)})" if a in restore else expr(a)

        ret = f"    return [{', '.join(returned(a) for a in out)}]"
    except (KeyError, TypeError):
        return "", None
    lines = ["def run(args):"]
    if runner.placeholders:
        lines.append("    " + ", ".join(names[p] for p in runner.placeholders) + ", = args")
    if fast:  # the first call's input layouts, and no launch hook: else the first runner
        lines += _guard_lines(runner, names, bind)
        lines += [f"    {local} = {bind('q', stream_of)}({index})" for index, (stream_of, local) in streams.items()]
    # the boxed calling convention hands the list over: emptied, an input is freed at its last use
    lines.append("    if args.__class__ is list: args.clear()")
    for node in runner.padding.copies:
        lines.append(f"    {names[node]} = {bind('p', layout.padded_copy)}({names[node]}, {runner.padding.rows[node]})")
    # an output made at the return (a constant ``lookup`` builds from symbolic sizes) keeps what it
    # is made from; an output a statement computed does not keep its inputs (GPT-2's K/V cache
    # copies kept each layer's whole q/k/v product alive to the end: 0.42 GiB at 8 x 1024 tokens)
    made_at_return = [a for a in nodes_in(out) if fusion.is_constant(a) and a not in defined]
    keep = set(runner.attrs) | set(nodes_in(out)) | {p for a in made_at_return for p in value_inputs(a)}
    last = {}
    for i, (_, reads, defines) in enumerate(statements):
        for n in defines:
            last.setdefault(n, i)
        for n in reads:
            last[n] = i
    order = {n: i for i, n in enumerate(runner.gm.graph.nodes)}
    for i, (line, _, _) in enumerate(statements):
        lines.append(line)
        gone = sorted((n for n, at in last.items() if at == i and n not in keep and n in defined), key=order.get)
        if gone:
            lines.append(f"    del {', '.join(names[n] for n in gone)}")
    lines.append(ret)
    source = "\n".join(lines) + "\n"
    filename = f"<kernelab runner {id(runner):x}>"
    exec(compile(source, filename, "exec"), scope)  # noqa: S102 - our own text
    # tracebacks, profilers and allocator histories through the runner show its lines
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return source, scope["run"]


def value_inputs(node: fx.Node, constants: bool = False) -> list:
    """The values ``node`` reads when it runs: its inputs, with each constant input (made on demand
    by ``lookup``, never a step of its own) followed through to the values it is made from (the
    symbolic sizes of ``full([s0, 6], 0)`` under dynamic shapes: a placeholder, a sym_size node),
    so that schedules keep those values and order the steps after them. ``constants``: the constant
    inputs themselves listed too."""
    out, seen = [], set()

    def walk(n: fx.Node) -> None:
        for p in n.all_input_nodes:
            if p in seen:
                continue
            seen.add(p)
            if fusion.is_constant(p):
                if constants:
                    out.append(p)
                walk(p)
            else:
                out.append(p)

    walk(node)
    return out


def _fetch_attr(gm: fx.GraphModule, target: str):
    """The value of a get_attr node: ``a.b.c`` looked up on the graph module."""
    value = gm
    for atom in target.split("."):
        value = getattr(value, atom)
    return value


def _schedule(gm, part, runners) -> list:
    """Units (a group, or one node outside any group) in an order that respects every edge."""
    unit_of, units = {}, []
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        g = part.group_of.get(n)
        if g is not None:
            if id(g) not in unit_of:
                unit_of[id(g)] = len(units)
                units.append(("group", runners[id(g)]))
            unit_of[n] = unit_of[id(g)]
        elif not fusion.is_constant(n):  # constants: made on demand (see lookup)
            unit_of[n] = len(units)
            units.append(("node", n))
    deps = [set() for _ in units]
    for n, u in list(unit_of.items()):
        if isinstance(n, fx.Node):
            for p in value_inputs(n):
                if p in unit_of and unit_of[p] != u:
                    deps[u].add(unit_of[p])
            mutated = fusion.mutated_input(n)
            if mutated is not None:  # an input written in place: after everything else that reads it
                deps[u].update(unit_of[r] for r in mutated.users if r in unit_of and unit_of[r] != u)
            # ordered after ops it has no edge from (rewrites._snapshots: copies of buffers that
            # in-place norms update through a later argument)
            deps[u].update(unit_of[p] for p in n.meta.get("kl_after", ()) if p in unit_of and unit_of[p] != u)
    order, done = [], set()
    while len(order) < len(units):
        progressed = False
        for i in range(len(units)):
            if i not in done and deps[i] <= done:
                order.append(units[i])
                done.add(i)
                progressed = True
                break
        if not progressed:
            raise RuntimeError("kernelab: the partition has a cycle between groups")
    return order


def _release(args) -> None:
    """Empty the caller's argument list: aot_autograd calls a boxed graph with a list it hands over
    (``steal_args``), as Inductor's wrapper expects, so that each input, a saved activation or a
    tangent of the backward, is freed after its last use instead of living until the graph returns
    (Llama's training step held a 2 GB logits tangent through its whole backward). A tuple (the
    direct inference call) is left as it is."""
    if args.__class__ is list:
        args.clear()


def _owned(gm: fx.GraphModule, part, donated: set) -> set:
    """Values that are the runner's own tensor objects, not one someone else may hold too: the
    donated inputs, and every value the graph computes except those that are another value's
    object (a kernel's output stored into a graph input, ``graph.absorb_copies``; an op writing an
    argument in place returns that argument; ``lift_fresh`` returns its input). Another tensor
    sharing the memory (a view, the base of a view, a saved copy) is seen per call by the storage's
    use count (``GroupRunner._outputs_over_inputs``); another holder of the same object is not,
    hence this list."""
    aliased = set(part.into) | {value for _, value, _ in part.into.values()}
    owned = set(donated)
    for n in gm.graph.nodes:
        if n.op == "call_function" and n not in aliased and not _returns_an_argument(n):
            owned.add(n)
    return owned


def _returns_an_argument(node: fx.Node) -> bool:
    """The op may return one of its arguments itself: in place (``add_``, ``copy_``: the schema's
    return is written), ``lift_fresh``, or an op without a schema (a Python function)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return True
    if fusion.target_name(node).startswith("aten.lift_fresh."):
        return True
    return any(r.alias_info is not None and r.alias_info.is_write for r in schema.returns)


def _plan_reuse(gm: fx.GraphModule, steps, free_after, returned: set, owned: set) -> None:
    """Each kernel's outputs that may be stored over an input it reads last (``GroupRunner.reuse``):
    last of every value sharing its memory too. A view read later may not be a tensor yet when
    the kernel runs (the runner replays a chain of views from its root where it is needed,
    ``views.py``), so the storage's use count cannot see it: ``amax`` read by a kernel and later
    through ``alias(amax)`` lost its values to the kernel's output before this check."""
    freed_at = {n: i for i, dead in enumerate(free_after) for n in dead}
    root = alias_roots(gm)
    needed_until = {}  # alias root -> the last step reading any value of its memory
    for n, r in root.items():
        until = float("inf") if n in returned else freed_at.get(n, -1)
        needed_until[r] = max(needed_until.get(r, -1), until)
    for i, ((kind, item), dead) in enumerate(zip(steps, free_after)):
        if kind == "group":
            item.reuse = item.reusable({n for n in owned.intersection(dead) if needed_until.get(root.get(n, n), i) <= i})


def _last_uses(steps, output, part) -> list:
    """After which step each value can be dropped, inputs included (keeps peak memory like eager)."""
    keep = set(value_inputs(output, constants=True))
    last = {}
    for i, (kind, item) in enumerate(steps):
        members = item.group.nodes if kind == "group" else [item]
        for n in members:
            for p in value_inputs(n, constants=True):
                last[p] = i
    frees = [[] for _ in steps]
    for n, i in last.items():
        if n not in keep and n.op != "get_attr":
            frees[i].append(n)
    return frees
