"""Random programs as people write them from tensors of a few shapes: chains of elementwise ops
and broadcasts, views (unsqueeze, expand, slices, transposes, permutes, reshapes), cats and
reductions (sums, extremes, softmax, logsumexp, cumsum, variance, layer norm, counts), several of
them read by more than one later op. Whatever the compiler groups, recomputes, merges or leaves to
ATen, the values and gradients must be eager's.

``program(seed, indexing=True)`` adds what models do with indices: indexing by a tensor, gather,
index_select, index_add, scatter_add, embedding, a batched matmul, masked_fill, an item set in place,
and, with ``by_value=True``, indices computed from the values (a gather at ``long()`` of values,
argmax, topk, integer arithmetic): those pick other elements when float16 rounds a value another
way, so the float16 test leaves them out. ``returns=True`` returns a tuple: the sum, then values
as they are (inputs, views of them, expands: aliases the compiled function must reproduce).
``strided=True`` stores the inputs out of order. ``mutating=True`` changes copies in place (mul_,
add_, copy_, masked_fill_, clamp_), whole or through views of them. ``convolution=True`` adds what
vision models do: depthwise, pointwise, strided and transposed convolutions (their weights cut
from y, so they get gradients too), batch norm in training mode, pools. ``integers=True`` adds an integer input
i (B, S) of class ids in [0, N): gathers, embeddings, cross-entropy, one-hot, scatters and
advanced indexing at i, and integer arithmetic on it. ``shaping=True`` adds what sequence and
attention code does: padding and cropping, rolls, flips, repeats, causal masks (``tril``, a
``-inf`` fill before a softmax), ``scaled_dot_product_attention``, splits and stacks, NaN
handling (``nan_to_num``, ``where(isnan)``), more reductions (std, prod, amin, argmin, norms,
cumprod, logcumsumexp, ``F.normalize``) and activations (ELU, Mish, hardswish, logsigmoid, erf,
leaky ReLU, ``lerp``, ``addcmul``, ``atan2``, ``remainder``, sign, round).

A program is Python source built from a seed (``program(seed)``): a failure prints the source, and
the seed reproduces it. Its inputs: x (B, S, N), y (S, N), z (B, S, 1), w (N,), and with
``integers``, i (B, S) (int64).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F

UNARY = ("F.gelu({})", "F.silu({})", "F.softplus({})", "{}.half().float()", "torch.clamp({}, -0.5, 0.7)",
         "torch.log1p({}.abs())", "torch.sqrt({}.abs() + 0.1)", "torch.floor({} * 3)", "(({} > 0).float() * 2)",
         "torch.exp({})", "torch.sigmoid({})", "-{}", "torch.abs({})", "torch.tanh({})", "({} * 0.5)",
         "torch.relu({})", "torch.where({0} > 0.1, {0}, 0.0)", "({} ** 2)", "torch.rsqrt({}.abs() + 1.0)")
BINARY = ("({} + {})", "({} * {})", "({} - {})", "torch.maximum({}, {})", "torch.where({} > {}, 1.0, -1.0)")
REDUCTIONS = ("sum", "amax", "mean", "softmax", "logsumexp", "cumsum", "var", "layer_norm", "max", "sum_dropped",
              "count_positive")


@dataclass
class Program:
    seed: int
    source: str
    sizes: tuple  # (B, S, N)
    integers: bool = False  # an int64 input i (B, S) of class ids in [0, N) after the float ones
    strided: bool = False  # x stored transposed (B, N, S memory order), y and w every other element

    def function(self):
        space = {"torch": torch, "F": F}
        exec(compile(self.source, f"<random program {self.seed}>", "exec"), space)
        return space["fn"]

    def magnitude(self):
        """The function with its returned sum taken over magnitudes, ``sum(|v|) * k`` for each
        ``v.sum() * k``: the scale of the sum's rounding error where its elements or terms cancel
        (a layer norm's outputs sum to 0; 19.0 - 19.44 + 0.55). (Of a tuple, the first item's.)"""
        head, _, total = self.source.rpartition("    return ")
        space = {"torch": torch, "F": F}
        exec(compile(f"{head}    return {total.replace('.float().sum()', '.float().abs().sum()')}", f"<magnitude of {self.seed}>",
                     "exec"), space)
        fn = space["fn"]
        return lambda *args: _first(fn(*args))

    def inputs(self, sizes=None, dtype=torch.float32, seed=None, device="cpu") -> list[torch.Tensor]:
        """x, y, z, w (and i): the same values on every device (drawn on the CPU)."""
        b, s, n = sizes or self.sizes
        g = torch.Generator().manual_seed(self.seed if seed is None else seed)
        shapes = ((b, s, n), (s, n), (b, s, 1), (n,))
        floats = [torch.randn(shape, generator=g).to(device=device, dtype=dtype) for shape in shapes]
        if self.strided:  # the same values in other memory orders: transposed, every other element
            strides = ((s * n, 1, s), (2 * n, 2), (s, 1, 1), (2,))
            floats = [strided_copy(t, st) for t, st in zip(floats, strides)]
        return floats + ([torch.randint(0, n, (b, s), generator=g).to(device)] if self.integers else [])


class _Writer:
    def __init__(self, rng: random.Random, sizes: tuple, indexing: bool = False, by_value: bool = False,
                 convolution: bool = False, integers: bool = False, returns: bool = False, mutating: bool = False,
                 shaping: bool = False):
        b, s, n = sizes
        self.indexing, self.by_value, self.convolution, self.integers = indexing, by_value, convolution, integers
        self.returns, self.mutating, self.shaping = returns, mutating, shaping
        self.rng, self.lines = rng, ["def fn(x, y, z, w, i):" if integers else "def fn(x, y, z, w):"]
        self.shapes = {"x": (b, s, n), "y": (s, n), "z": (b, s, 1), "w": (n,)}
        self.names = list(self.shapes)  # (float values only: i is read by the integer statements)

    def value(self, recent: int, bias: float) -> str:
        """A value, most often one of the last few (chains), sometimes any earlier one (reuse)."""
        return self.rng.choice(self.names[-recent:] if self.rng.random() < bias else self.names)

    def new(self, expression: str, shape: tuple) -> str:
        name = f"v{len(self.names) - 3}"
        self.lines.append(f"    {name} = {expression}")
        self.shapes[name] = tuple(shape)
        self.names.append(name)
        return name

    def statement(self) -> None:
        rng = self.rng
        # (each option draws from rng only when on: a seed's program without it stays the same)
        if self.convolution and rng.random() < 0.25:
            a = self.value(3, 0.7)
            if 3 <= len(self.shapes[a]) <= 4:
                self.convolved(a, self.shapes[a])
            return
        if self.integers and rng.random() < 0.25:
            self.with_ids(self.value(3, 0.7))
            return
        if self.shaping and rng.random() < 0.3:
            a = self.value(3, 0.7)
            if self.shapes[a]:
                self.shaped(a, self.shapes[a])
            return
        if self.mutating and rng.random() < 0.25:
            a = self.value(3, 0.7)
            if self.shapes[a]:
                self.mutated(a, self.shapes[a])
            return
        if self.indexing and rng.random() < 0.35:
            a = self.value(3, 0.7)
            if self.shapes[a]:
                self.indexed(a, self.shapes[a])
            return
        r = rng.random()
        a = self.value(3, 0.7)
        shape = self.shapes[a]
        if r < 0.3:
            self.new(rng.choice(UNARY).format(a), shape)
        elif r < 0.55:
            b = self.value(4, 0.5)
            try:
                both = torch.broadcast_shapes(shape, self.shapes[b])
            except RuntimeError:
                return
            self.new(rng.choice(BINARY).format(a, b), both)
        elif r < 0.7 and len(shape) < 4:
            d = rng.randint(0, len(shape))
            self.new(f"{a}.unsqueeze({d})", shape[:d] + (1,) + shape[d:])
        elif r < 0.78 and 1 in shape:
            d, size = shape.index(1), rng.choice([2, 3])
            target = [-1] * len(shape)
            target[d] = size
            self.new(f"{a}.expand({tuple(target)})", shape[:d] + (size,) + shape[d + 1:])
        elif r < 0.8 and len(shape) >= 2 and shape[-1] > 1:
            self.new(f"{a}[..., 1:]", shape[:-1] + (shape[-1] - 1,))
        elif r < 0.82 and shape:
            b = rng.choice([n for n in self.names if len(self.shapes[n]) == len(shape)
                            and self.shapes[n][:-1] == shape[:-1]])
            self.new(f"torch.cat([{a}, {b}], -1)", shape[:-1] + (shape[-1] + self.shapes[b][-1],))
        elif r < 0.84 and len(shape) == 3:
            self.new(f"{a}.permute(2, 0, 1)", (shape[2], shape[0], shape[1]))
        elif r < 0.85 and len(shape) >= 2:
            self.new(f"{a}.transpose(-1, -2)", shape[:-2] + (shape[-1], shape[-2]))
        elif r < 0.9 and len(shape) >= 2:
            self.new(f"{a}.reshape(-1, {shape[-1]})", (_numel(shape) // shape[-1], shape[-1]))
        else:
            self.reduction(a, shape)

    def indexed(self, a: str, shape: tuple) -> None:
        """One statement that indexes (``indexing=True``): fixed indices, or with ``by_value``,
        indices computed from the values."""
        rng, n, rows = self.rng, shape[-1], self.shapes["y"][0]
        picks = [rng.randrange(n) for _ in range(rng.choice([2, 3]))]
        spread = f"(torch.arange({n}, device=x.device) * {rng.choice([1, 2, 3])} % {n})"  # repeats where the step shares a factor
        fixed = [
            (f"{a}[..., torch.tensor({picks}, device=x.device)]", shape[:-1] + (len(picks),)),
            (f"{a}.index_select(-1, torch.tensor({picks}, device=x.device))", shape[:-1] + (len(picks),)),
            (f"torch.gather({a}, -1, {spread}.expand({shape}))", shape),
            (f"torch.zeros_like({a}).scatter_add(-1, {spread}.expand({shape}), {a})", shape),
            (f"torch.zeros({n}, dtype={a}.dtype, device=x.device).index_add(0, torch.tensor({[rng.randrange(n) for _ in range(n)]}, device=x.device), "
             f"{a}.reshape(-1, {n})[0])", (n,)),
            (f"F.embedding(torch.arange({n}, device=x.device) % {rows}, y)", (n, self.shapes["y"][1])),
            (f"{a}.masked_fill({a} > 0.5, -1.0)", shape),
        ]
        if len(shape) >= 2:
            b = rng.choice([m for m in self.names if len(self.shapes[m]) >= 2 and self.shapes[m][-1] == n] or [a])
            try:
                batch = torch.broadcast_shapes(shape[:-2], self.shapes[b][:-2])
                fixed.append((f"({a} @ {b}.transpose(-1, -2).to({a}.dtype))", batch + (shape[-2], self.shapes[b][-2])))
            except RuntimeError:
                pass
        by_value = [
            (f"torch.gather({a}, -1, ({a}.abs() * 100).long() % {n})", shape),
            (f"((({a} * 10).long() % 3) * 2 + 1).float()", shape),
            (f"{a}.argmax({len(shape) - 1}).float()", shape[:-1]),
            (f"{a}.topk(2, -1).values", shape[:-1] + (2,)),
            (f"F.embedding(({a}.abs() * 10).long() % {rows}, y)", shape + (self.shapes["y"][1],)),
        ] if self.by_value and len(shape) <= 3 else []
        choices = fixed + [c for c in by_value if n >= 2 and (len(c[1]) <= 4)]
        if rng.random() < 0.1:  # an item set in place, on a copy
            name = self.new(f"{a}.clone()", shape)
            self.lines.append(f"    {name}[..., {rng.randrange(n)}] = {rng.choice(['0.0', '2.5'])}")
            return
        expression, out = rng.choice(choices)
        self.new(expression, out)

    def convolved(self, a: str, shape: tuple) -> None:
        """A convolution, batch norm or pool over a value read as (batch, channels, length) or
        (batch, channels, height, width); weights are cut from y (S, N) or its transpose, so
        they have gradients of their own."""
        rng, (s, n) = self.rng, self.shapes["y"]
        c, spatial = shape[1], shape[2:]
        if c > max(s, n):
            return
        normed = _numel(shape) // c > 1  # (batch norm in training needs two values a channel)
        taps = f"({'y' if c <= s else 'y.t()'}[:{c}, :3].to({a}.dtype))"  # (c, 3): per-channel taps
        if len(shape) == 4:  # depthwise 3x3 (the outer product of two taps), same size
            weight = f"({taps}.unsqueeze(-1) * {taps}.unsqueeze(-2)).unsqueeze(1)"
            choices = [(f"F.conv2d({a}, {weight}, padding=1, groups={c})", shape),
                       (f"F.max_pool2d({a}, 2, ceil_mode=True)", shape[:2] + tuple((d + 1) // 2 for d in spatial))]
            choices += [(f"F.batch_norm({a}, None, None, training=True)", shape)] if normed else []
            expression, out = rng.choice(choices)
            self.new(expression, out)
            return
        (length,) = spatial
        mix = f"torch.cat([x.reshape(-1)] * 2)[:{c * c}].reshape({c}, {c}, 1).to({a}.dtype)"  # (c, c, 1): pointwise
        bias = f"w[:{c}].to({a}.dtype)" if c <= n else "None"
        image = f"{a}.unsqueeze(1)"  # one channel, (rows, length) as an image
        square = f"y[:3, :3].reshape(1, 1, 3, 3).to({a}.dtype)"
        choices = [
            (f"F.conv1d({a}, {taps}.unsqueeze(1), padding=1, groups={c})", shape),
            (f"F.conv1d({a}, {mix}, {bias})", shape),
            (f"F.conv1d({a}, {taps}.unsqueeze(1), stride=2, groups={c})", (shape[0], c, (length - 3) // 2 + 1)),
            (f"F.conv_transpose1d({a}, {taps}.unsqueeze(1), groups={c})", (shape[0], c, length + 2)),
            (f"F.conv2d({image}, {square}, padding=1).squeeze(1)", shape),
            (f"F.conv2d({image}, {square}, stride=2, padding=1).squeeze(1)",
             (shape[0], (c - 1) // 2 + 1, (length - 1) // 2 + 1)),
            (f"F.max_pool1d({a}, 2)", (shape[0], c, length // 2)),
            (f"F.avg_pool1d({a}, 2, 1)", (shape[0], c, length - 1)),
            (f"F.adaptive_avg_pool1d({a}, 1)", (shape[0], c, 1)),
        ] + ([
            (f"F.batch_norm({a}, None, None, training=True)", shape),
            (f"F.batch_norm({a}, torch.zeros({c}, device=x.device, dtype={a}.dtype), "
             f"torch.ones({c}, device=x.device, dtype={a}.dtype), {bias}, None, training=True)", shape),
        ] if normed else [])
        expression, out = rng.choice([(e, o) for e, o in choices if min(o) >= 1])
        self.new(expression, out)

    def mutated(self, a: str, shape: tuple) -> None:
        """A copy of ``a`` changed in place, whole or through a view of it (a slice, a row, a
        transposed column, every other element): later statements read the changed copy."""
        rng = self.rng
        c = self.new(f"{a}.clone(memory_format=torch.contiguous_format)", shape)
        k = rng.randint(1, shape[-1])
        views = [(c, shape), (f"{c}[..., :{k}]", shape[:-1] + (k,)), (f"{c}[0]", shape[1:]),
                 (f"{c}.view(-1)[::2]", ((_numel(shape) + 1) // 2,))]
        if len(shape) >= 2:
            views.append((f"{c}.transpose(-1, -2)[..., 0]", shape[:-2] + (shape[-1],)))
        target, tshape = rng.choice(views)
        others = [m for m in self.names if m != c and _broadcasts(self.shapes[m], tshape)]
        ops = [".mul_(0.5)", ".add_(1.0)", f".masked_fill_({target} > 0.3, -1.0)", ".clamp_(-0.6, 0.6)"]
        if others:
            b = rng.choice(others)
            ops += [f".add_({b}.to({c}.dtype))", f".copy_({b}.to({c}.dtype))", f".mul_({b}.to({c}.dtype))"]
        self.lines.append(f"    {target}{rng.choice(ops)}")

    def shaped(self, a: str, shape: tuple) -> None:
        """One statement of what sequence and attention code does (``shaping=True``)."""
        rng, n, d = self.rng, shape[-1], len(shape) - 1
        b = rng.choice([m for m in self.names if _broadcasts(self.shapes[m], shape)] or [a])
        k = rng.randint(1, max(1, n - 1))
        choices = [
            (f"F.pad({a}, ({rng.choice([0, 1, 2])}, {rng.choice([0, 1, 3])}))", None),
            (f"F.pad({a}, (-1, 1), value=0.5)" if n > 1 else f"F.pad({a}, (1, 0))", shape[:-1] + (n + (0 if n > 1 else 1),)),
            (f"torch.roll({a}, {rng.choice([1, -2, 3])}, {d})", shape),
            (f"torch.flip({a}, ({d},))", shape),
            (f"{a}.repeat({', '.join(['1'] * d + ['2'])})", shape[:-1] + (2 * n,)),
            (f"torch.stack([{a}, {b}.expand_as({a})], {rng.randint(0, d + 1)})", None),
            (f"sum({a}.split({k}, -1)[:1]) * {a}[..., :{k}]", shape[:-1] + (k,)),
            (f"{a}.narrow(-1, {n - k}, {k})", shape[:-1] + (k,)),
            (f"torch.nan_to_num(torch.log({a}), nan=0.0, neginf=-3.0)", shape),
            (f"torch.where(torch.isnan(torch.sqrt({a})), {b}, {a})", shape),
            (f"{a}.std({d}, keepdim=True)", shape[:-1] + (1,)),
            (f"torch.tanh({a}).prod({d}, keepdim=True)", shape[:-1] + (1,)),
            (f"{a}.amin({d})", shape[:-1]),
            (f"{a}.argmin({d}).to({a}.dtype)", shape[:-1]),
            (f"torch.linalg.vector_norm({a}, dim={d}, keepdim=True)", shape[:-1] + (1,)),
            (f"{a}.norm(p=1, dim={d})", shape[:-1]),
            (f"torch.cumprod(torch.sigmoid({a}), {d})", shape),
            (f"torch.logcumsumexp({a}, {d})", shape),
            (f"F.normalize({a}, dim={d})", shape),
            (f"F.elu({a})", shape), (f"F.mish({a})", shape), (f"F.hardswish({a})", shape),
            (f"F.logsigmoid({a})", shape), (f"torch.erf({a})", shape), (f"F.leaky_relu({a}, 0.1)", shape),
            (f"torch.lerp({a}, {b}.to({a}.dtype), 0.3)", shape), (f"torch.addcmul({a}, {b}, {b}, value=0.5)", shape),
            (f"torch.atan2({a}, {b} + 2.0)", shape), (f"torch.remainder({a} * 3, 1.0)", shape),
            (f"torch.sign({a}) * {b}", shape), (f"torch.round({a} * 4) / 4", shape),
        ]
        if len(shape) >= 2:
            rows = shape[-2]
            causal = f"torch.ones({rows}, {n}, dtype=torch.bool, device=x.device).triu(1)"
            choices += [
                (f"torch.tril({a})", shape),
                (f"torch.softmax({a}.masked_fill({causal}, float('-inf')), -1)", shape),
                (f"{a}.triu(-1) + {a}.tril(-2) * 0.5", shape),
            ]
            if len(shape) >= 3:
                q = f"{a}.unsqueeze(1)" if len(shape) == 3 else a
                choices.append((f"F.scaled_dot_product_attention({q}, {q} * 0.5, {q}.flip(-2), "
                                f"is_causal={rng.choice([True, False])}).squeeze(1)" if len(shape) == 3 else
                                f"F.scaled_dot_product_attention({q}, {q} * 0.5, {q}.flip(-2))", shape))
        expression, out = rng.choice(choices)
        if out is None:  # a shape eager works out (pads, stacks)
            try:
                out = tuple(eval(expression, {"torch": torch, "F": F, "x": torch.empty(self.shapes["x"]),
                                              **{m: torch.zeros(sh) for m, sh in self.shapes.items()}}).shape)
            except RuntimeError:
                return
        self.new(expression, out)

    def with_ids(self, a: str) -> None:
        """A statement that reads the class ids i (B, S), int64 in [0, N)."""
        rng, shape, (b, s, n) = self.rng, self.shapes[a], self.shapes["x"]
        choices = [
            (f"F.embedding(i % {s}, y)", (b, s, n)),  # (y's S rows as the table)
            (f"((i * 3 + 1) % {n}).to(x.dtype)", (b, s)),
            (f"(i == i.amax(-1, keepdim=True)).to(x.dtype)", (b, s)),
            (f"torch.where(i > {n // 2}, x.sum(-1), 0.0)", (b, s)),
        ]
        if shape and shape[0] > 0:
            choices.append((f"{a}[i % {shape[0]}]", (b, s) + shape[1:]))
            choices.append((f"{a}.index_select(0, i.reshape(-1) % {shape[0]})", (b * s,) + shape[1:]))
        if len(shape) == 3 and shape[:2] == (b, s):
            m = shape[-1]
            ids = f"(i % {m})"
            choices += [
                (f"torch.gather({a}, -1, {ids}.unsqueeze(-1))", (b, s, 1)),
                (f"F.cross_entropy({a}.reshape(-1, {m}).float(), {ids}.reshape(-1))", ()),
                (f"F.cross_entropy({a}.reshape(-1, {m}).float(), {ids}.reshape(-1), reduction='none', "
                 f"label_smoothing=0.1)", (b * s,)),
                (f"F.cross_entropy({a}.transpose(1, 2).float(), torch.where({ids} == 0, -100, {ids}))", ()),
                (f"(F.one_hot({ids}, {m}).to({a}.dtype) * {a})", shape),
                (f"torch.zeros_like({a}).scatter_add(-1, {ids}.unsqueeze(-1), {a}[..., :1])", shape),
                (f"{a}.masked_fill(({ids} == 1).unsqueeze(-1), 0.0)", shape),
            ]
        expression, out = rng.choice(choices)
        self.new(expression, out)

    def reduction(self, a: str, shape: tuple) -> None:
        if not shape:
            return  # (a single value: nothing to reduce over)
        op, d = self.rng.choice(REDUCTIONS), self.rng.randint(0, len(shape) - 1)
        kept, dropped = shape[:d] + (1,) + shape[d + 1:], shape[:d] + shape[d + 1:]
        expression, out = {
            "sum": (f"{a}.sum({d}, keepdim=True)", kept),
            "amax": (f"{a}.amax({d}, keepdim=True)", kept),
            "mean": (f"{a}.mean({d}, keepdim=True)", kept),
            "softmax": (f"torch.softmax({a}, {d})", shape),
            "logsumexp": (f"torch.logsumexp({a}, {d}, keepdim=True)", kept),
            "cumsum": (f"torch.cumsum({a}, {d})", shape),
            "var": (f"{a}.var({d}, keepdim=True)", kept),
            "layer_norm": (f"F.layer_norm({a}, ({shape[-1]},))", shape),
            "max": (f"{a}.max({d}).values", dropped),
            "sum_dropped": (f"{a}.sum({d})", dropped),
            "count_positive": (f"({a} > 0).sum({d}).float()", dropped),
        }[op]
        if op == "var" and shape[d] == 1:
            return  # (a variance of one value is NaN in eager and compiled alike: nothing to learn)
        self.new(expression, out)

    def source(self) -> str | None:
        made = self.names[4:]
        if not made:
            return None
        picks = self.rng.sample(made, min(len(made), self.rng.randint(1, 3)))
        terms = [f"{p}.float().sum() * {i + 1}" for i, p in enumerate(picks)] + [f"({picks[0]} ** 2).sum() * 0.01"]
        total = " + ".join(terms)
        if self.returns:  # values returned as they are too: views (of the inputs too), expands, aliases
            total = f"({total}, {', '.join(self.rng.sample(self.names, self.rng.randint(1, 3)))})"
        return "\n".join(self.lines + ["    return " + total])


def strided_copy(t: torch.Tensor, strides: tuple, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A leaf with ``t``'s values (in ``dtype``) at ``strides``, the elements between them NaN: a
    kernel that reads a gap (an input taken as denser than it is) makes its output NaN, every time,
    where uninitialized memory gave whatever was there (0.06 one run, 3.6e15 the next)."""
    out = torch.empty_strided(t.shape, strides, dtype=dtype or t.dtype, device=t.device)
    with torch.no_grad():
        if out.is_floating_point():
            whole = torch.empty(0, dtype=out.dtype, device=out.device)
            whole.set_(out.untyped_storage(), 0, (out.untyped_storage().nbytes() // out.element_size(),)).fill_(float("nan"))
        out.copy_(t)
    return out


def _broadcasts(shape: tuple, to: tuple) -> bool:
    """Does a value of ``shape`` broadcast to ``to`` without changing it (an in-place operand)?"""
    if len(shape) > len(to):
        return False
    return all(a in (1, b) for a, b in zip(shape[::-1], to[::-1]))


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def program(seed: int, indexing: bool = False, by_value: bool = False, convolution: bool = False,
            integers: bool = False, returns: bool = False, strided: bool = False,
            mutating: bool = False, shaping: bool = False) -> Program | None:
    """The program of ``seed`` (None for the rare seed whose statements made no value); with
    ``indexing``, statements that index too (``by_value``: also by indices computed from values);
    ``convolution``: convolutions, batch norms and pools; ``integers``: an int64 input of ids;
    ``returns``: a tuple, the sum then 1-3 values (inputs, views, expands) as they are;
    ``strided``: inputs stored out of order (x transposed, y and w every other element);
    ``mutating``: copies changed in place, whole or through views; ``shaping``: pads, rolls,
    flips, causal masks, attention, NaN handling, more reductions and activations."""
    rng = random.Random(seed)
    sizes = (rng.choice([2, 3]), rng.choice([4, 5]), rng.choice([8, 6]))
    writer = _Writer(rng, sizes, indexing, by_value, convolution, integers, returns, mutating, shaping)
    for _ in range(rng.randint(4, 10)):
        writer.statement()
    source = writer.source()
    return Program(seed, source, sizes, integers, strided) if source else None
