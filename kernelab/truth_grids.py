"""Grids of library calls whose kernels depend on the library's own heuristics (cuBLAS, cuDNN, cub,
ATen's reduce), and the model zoo's training steps: programs to record on a GPU as ground truth.

The built-in programs (``kernelab.programs``) were written with the eager rules in mind; these are
drawn at random from wide parameter spaces, so the rules can be learnt from one sample and checked
on another drawn later:

    from kernelab.truth_grids import grid_programs, zoo_programs
    grid_programs(seed=0)        # the sample the rules were written from ("fit")
    grid_programs(seed=1)        # a fresh sample, recorded after the rules were written ("fresh")
    zoo_programs()               # one training step of every zoo model at benchmark size

``benchmarks/record_truth.py --set grids-fit|grids-fresh|zoo`` records them on the GPU into
``tests/data/``; ``tests/test_truth_grids.py`` predicts every one on the CPU and compares.

Every program's name spells its parameters (``gemm_linear_bias_bf16_4096x1024x768``), its arguments
are built deterministically on the CPU from its name, and no tensor exceeds ``MAX_ELEMENTS``, so a
whole grid records in about a minute.
"""

from __future__ import annotations

import random
import zlib
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .programs import Program

__all__ = ["grid_programs", "zoo_programs", "FAMILIES", "MAX_ELEMENTS"]

MAX_ELEMENTS = 48 * 2**20  # per tensor: 192 MB in float32
DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _gen(name: str) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(name.encode()))


def _randn(g, *shape, dtype=torch.float32, requires_grad=False):
    return torch.randn(*shape, generator=g).to(dtype).requires_grad_(requires_grad)


def _fits(*shapes) -> bool:
    return all(torch.Size(s).numel() <= MAX_ELEMENTS for s in shapes)


# ----------------------------------------------------------------------------- GEMMs (cuBLAS)
#
# Three layouts as models call them: F.linear (x @ w.T, the forward), a.T @ b (the weight
# gradient's layout: both operands stored K-major), and a plain a @ b (the input gradient's).
# Float32 twice: full precision (the default) and TF32 (allow_tf32 set for the call only).

GEMM_M = (1, 2, 8, 16, 64, 100, 128, 197, 256, 512, 1000, 1024, 2048, 3000, 4096, 8192, 16384)
GEMM_NK = (64, 128, 256, 384, 512, 768, 1000, 1024, 1536, 2048, 3072, 4096, 5120, 8192, 11008, 14336)


def _with_tf32(fn: Callable) -> Callable:
    """``fn`` run with TF32 matmuls allowed, the setting restored after the call."""
    def call(*args):
        before = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            return fn(*args)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = before
    call.__name__ = f"{fn.__name__}_tf32"
    return call


def gemm_linear(x, w):
    return F.linear(x, w)


def gemm_linear_bias(x, w, b):
    return F.linear(x, w, b)


def gemm_tn(a, b):
    return a.t() @ b


def gemm_nn(a, b):
    return a @ b


GEMM_FORMS = {"linear": gemm_linear, "linear_bias": gemm_linear_bias, "tn": gemm_tn, "nn": gemm_nn}


def _gemm_args(form: str, m: int, n: int, k: int, dtype: torch.dtype, g) -> tuple:
    if form == "linear":
        return _randn(g, m, k, dtype=dtype), _randn(g, n, k, dtype=dtype)
    if form == "linear_bias":
        return _randn(g, m, k, dtype=dtype), _randn(g, n, k, dtype=dtype), _randn(g, n, dtype=dtype)
    if form == "tn":  # (K, M) stored, read transposed: the weight gradient x.T @ dy
        return _randn(g, k, m, dtype=dtype), _randn(g, k, n, dtype=dtype)
    return _randn(g, m, k, dtype=dtype), _randn(g, k, n, dtype=dtype)


def _gemm_program(rng: random.Random) -> Program | None:
    form = rng.choice(tuple(GEMM_FORMS))
    prec = rng.choice(tuple(DTYPES))
    m, n, k = rng.choice(GEMM_M), rng.choice(GEMM_NK), rng.choice(GEMM_NK)
    if not _fits((m, k), (n, k), (m, n)) or 2 * m * n * k > 2e12:
        return None
    name = f"gemm_{form}_{prec}_{m}x{n}x{k}"
    fn = GEMM_FORMS[form]
    target = _with_tf32(fn) if prec == "tf32" else fn
    return Program(name, f"{form} GEMM, M={m} N={n} K={k}, {prec}", lambda: target,
                   lambda: _gemm_args(form, m, n, k, DTYPES[prec], _gen(name)))


# ----------------------------------------------------------------------------- convolutions (cuDNN)

CONV_CHANNELS = (3, 16, 32, 48, 64, 96, 128, 256, 512)
CONV_SIDES = (7, 14, 28, 56, 112)
CONV_DTYPES = ("fp32", "bf16", "fp16")


class Conv(nn.Module):
    """One convolution, forward only or forward + backward (``train``: input and weight get grads)."""

    def __init__(self, cin, cout, kernel, stride, groups, bias, train):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=bias)
        self.train_step = train

    def forward(self, x):
        y = self.conv(x)
        if self.train_step:
            y.sum().backward()
        return y


def _conv_program(rng: random.Random) -> Program | None:
    prec = rng.choice(CONV_DTYPES)
    batch, side = rng.choice((1, 8, 32)), rng.choice(CONV_SIDES)
    kernel, stride = rng.choice((1, 3, 3, 7)), rng.choice((1, 1, 2))
    depthwise = rng.random() < 0.2
    cin = rng.choice(CONV_CHANNELS[1:] if depthwise else CONV_CHANNELS)
    cout = cin if depthwise else rng.choice(CONV_CHANNELS[1:])
    groups = cin if depthwise else 1
    bias, train = rng.random() < 0.5, rng.random() < 0.4
    layout = rng.choice(("nchw", "nhwc"))
    if not _fits((batch, max(cin, cout), side, side)):
        return None
    name = (f"conv_{'dw' if depthwise else 'k'}{kernel}s{stride}_{prec}_{layout}_{batch}x{cin}x{side}x{side}"
            f"_to{cout}{'_bias' if bias else ''}{'_train' if train else ''}")
    dtype = DTYPES[prec]

    def target():
        torch.manual_seed(zlib.crc32(name.encode()))
        module = Conv(cin, cout, kernel, stride, groups, bias, train).to(dtype)
        return module.to(memory_format=torch.channels_last) if layout == "nhwc" else module

    def args():
        x = _randn(_gen(name), batch, cin, side, side, dtype=dtype, requires_grad=train)
        if layout == "nhwc":
            x = x.detach().to(memory_format=torch.channels_last).requires_grad_(train)
        return (x,)

    return Program(name, f"conv {kernel}x{kernel}/{stride}, {cin}->{cout} ch, {side}px, batch {batch}, "
                         f"{prec} {layout}{', +backward' if train else ''}", target, args)


# ----------------------------------------------------------------------------- sort / topk (cub, ATen)

SORT_LENGTHS = (16, 100, 512, 1000, 2048, 4096, 5000, 8192, 32768, 100000, 1 << 20)
SORT_SLICES = (1, 4, 16, 64, 256, 1024, 4096, 16384)
SORT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "i64": torch.int64}


def sort_last(x):
    return torch.sort(x, dim=-1)


def sort_first(x):
    return torch.sort(x, dim=0)


def argsort_stable(x):
    return torch.argsort(x, dim=-1, stable=True)


def _topk(k: int, largest: bool, sorted_: bool) -> Callable:
    def topk(x):
        return torch.topk(x, k, dim=-1, largest=largest, sorted=sorted_)
    return topk


def _sort_args(prec: str, slices: int, length: int, g) -> tuple:
    if prec == "i64":
        return (torch.randint(0, 1 << 40, (slices, length), generator=g),)
    return (_randn(g, slices, length, dtype=SORT_DTYPES[prec]),)


def _sort_program(rng: random.Random) -> Program | None:
    prec = rng.choice(tuple(SORT_DTYPES))
    slices, length = rng.choice(SORT_SLICES), rng.choice(SORT_LENGTHS)
    if not _fits((slices, length)) or slices * length > 16 * 2**20:
        return None
    kind = rng.choice(("last", "first", "argsort", "topk", "topk"))
    if kind == "topk":
        k = min(rng.choice((1, 5, 10, 50, 100, 1000)), length)
        largest, sorted_ = rng.random() < 0.8, rng.random() < 0.7
        fn = _topk(k, largest, sorted_)
        kind = f"topk{k}{'' if largest else '_smallest'}{'' if sorted_ else '_unsorted'}"
    else:
        fn = {"last": sort_last, "first": sort_first, "argsort": argsort_stable}[kind]
    name = f"sort_{kind}_{prec}_{slices}x{length}"
    return Program(name, f"{kind} over {slices} rows of {length}, {prec}", lambda: fn,
                   lambda: _sort_args(prec, slices, length, _gen(name)))


# ----------------------------------------------------------------------------- reductions (ATen reduce)

REDUCE_SIZES = (1, 7, 64, 100, 768, 1000, 4096, 5120, 16384, 50257, 262144, 1 << 20)


def _reduction(op: str, dim) -> Callable:
    def reduce(x):
        if op == "var":
            return torch.var(x, dim=dim)
        if op == "norm":
            return torch.linalg.vector_norm(x, dim=dim)
        return getattr(torch, op)(x) if dim is None else getattr(torch, op)(x, dim=dim)
    return reduce


def _reduce_program(rng: random.Random) -> Program | None:
    op = rng.choice(("sum", "mean", "amax", "var", "norm", "sum"))
    rows, cols = rng.choice(REDUCE_SIZES), rng.choice(REDUCE_SIZES)
    prec = rng.choice(("fp32", "bf16"))
    where = rng.choice(("all", "rows", "cols"))
    if not _fits((rows, cols)) or rows * cols < 64:
        return None
    dim = {"all": None, "rows": -1, "cols": 0}[where]
    if op == "amax" and dim is None:
        dim = (0, 1)
    name = f"reduce_{op}_{where}_{prec}_{rows}x{cols}"
    fn = _reduction(op, dim)
    return Program(name, f"{op} over {where} of {rows}x{cols}, {prec}", lambda: fn,
                   lambda: (_randn(_gen(name), rows, cols, dtype=DTYPES[prec]),))


FAMILIES: dict[str, tuple[Callable[[random.Random], Program | None], int]] = {
    # family -> (draw one program, how many per sample)
    "gemm": (_gemm_program, 120),
    "conv": (_conv_program, 60),
    "sort": (_sort_program, 50),
    "reduce": (_reduce_program, 50),
}


def grid_programs(seed: int, families=tuple(FAMILIES), scale: float = 1.0) -> dict[str, Program]:
    """A random sample of every family's parameter space, by name (duplicates drawn once)."""
    rng = random.Random(seed)
    programs: dict[str, Program] = {}
    for family in families:
        draw, count = FAMILIES[family]
        wanted, tries = int(count * scale), 0
        taken = 0
        while taken < wanted and tries < 50 * wanted:
            tries += 1
            program = draw(rng)
            if program is not None and program.name not in programs:
                programs[program.name] = program
                taken += 1
    return programs


# ----------------------------------------------------------------------------- the zoo's training steps

class ZooStep(nn.Module):
    """One training step of a zoo model: loss forward, then backward (the gradients stay on .grad)."""

    def __init__(self, zoo_model, model):
        super().__init__()
        self.zoo_model = zoo_model
        self.model = model

    def forward(self, inputs):
        loss = self.zoo_model.loss(self.model, inputs)
        loss.backward()
        return loss.detach()


class _ZooBuild:
    """Builds a zoo model and its inputs once for ``make_target`` then ``make_args`` (called in that
    order); ``make_args`` lets go of them, so a recording holds one model at a time."""

    def __init__(self, zoo_model, size: str):
        self.zoo_model, self.size, self.built = zoo_model, size, None

    def _build(self):
        if self.built is None:
            zm = self.zoo_model
            model, inputs = zm.build(self.size, device="cpu", dtype=zm.dtype)
            self.built = (ZooStep(zm, model), (inputs,))
        return self.built

    def target(self):
        return self._build()[0]

    def args(self):
        args = self._build()[1]
        self.built = None
        return args


def zoo_programs(size: str = "bench", names=None) -> dict[str, Program]:
    """``zoo_<model>_train``: one training step of each zoo model, in the dtype it is usually run in."""
    from .zoo import ZOO

    programs = {}
    for name in names or ZOO:
        zm, build = ZOO[name], _ZooBuild(ZOO[name], size)
        programs[f"zoo_{name}_train"] = Program(
            f"zoo_{name}_train", f"{zm.summary[size]}; one training step, {str(zm.dtype)[6:]}",
            build.target, build.args)
    return programs


# ----------------------------------------------------------------------------- prediction vs truth

def recorded_categories(kernels: list[dict]) -> list[str]:
    """The category sequence of recorded kernels: memops by their kind, kernels by category."""
    return [k["category"] if k["kind"] == "kernel" else k["kind"] for k in kernels]


def family(name: str) -> str:
    """``gemm_linear_bf16_...`` -> ``gemm``; ``zoo_gpt2_train`` -> ``zoo``."""
    return name.split("_")[0]


def compare(truth: dict, programs: dict[str, Program], mode: str) -> list[dict]:
    """Predict every recorded program of ``truth`` (a tests/data JSON) in ``mode`` on this machine and
    compare with the GPU: one row per program with the family, both category sequences, whether they
    are equal, and the category overlap (shared kernels / the larger count)."""
    from collections import Counter

    from .api import count

    rows = []
    for name, entry in sorted(truth["programs"].items()):
        if not entry.get(mode) or name not in programs:
            continue
        program = programs[name]
        predicted = count(program.make_target(), *program.make_args(), mode=mode, predict=True).categories
        recorded = recorded_categories(entry[mode])
        shared = sum((Counter(recorded) & Counter(predicted)).values())
        rows.append({"program": name, "family": family(name), "mode": mode, "recorded": recorded,
                     "predicted": predicted, "exact": recorded == predicted,
                     "overlap": shared / max(len(recorded), len(predicted), 1)})
    return rows


def accuracy(rows: list[dict]) -> dict[str, tuple[int, int]]:
    """family -> (exact, programs), plus "all"."""
    table: dict[str, list[int]] = {}
    for row in rows:
        for key in (row["family"], "all"):
            exact, total = table.setdefault(key, [0, 0])
            table[key] = [exact + row["exact"], total + 1]
    return {k: (v[0], v[1]) for k, v in table.items()}
