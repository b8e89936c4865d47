"""GPU correctness checks that the benchmark grid does not cover: odd and non-contiguous shapes
in bfloat16 (which the CPU interpreter cannot test) and inputs past 2^31 elements.

Each check runs kernelab's op forward and backward on fresh random inputs with poisoned outputs
and compares with float64 PyTorch (relative L2 error, NaN where the reference is finite fails).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import kernelab.ops as K

from . import timing

ODD_SHAPES = [(1, 1), (3, 7), (4, 4097), (2, 70001), (2, 262147)]
STRIDED = {4097, 70001}  # also checked through a row stride (a column slice of a wider tensor)


def _ops():
    """name -> (kernelab fn, reference fn, number of [N] parameters)."""
    return {
        "softmax": (lambda x: K.softmax(x, -1), lambda x: torch.softmax(x, -1), 0),
        "log_softmax": (lambda x: K.log_softmax(x, -1), lambda x: torch.log_softmax(x, -1), 0),
        "layer_norm": (lambda x, w, b: K.layer_norm(x, x.shape[-1:], w, b), lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b), 2),
        "rms_norm": (lambda x, w: K.rms_norm(x, x.shape[-1:], w, 1e-6), lambda x, w: F.rms_norm(x, x.shape[-1:], w, 1e-6), 1),
        "bias_gelu": (lambda x, b: K.bias_gelu(x, b), lambda x, b: F.gelu(x + b), 1),
        "cross_entropy": (None, None, 0),
    }


def _check(fn, ref_fn, args, dtype, grad_idx, device) -> float:
    ref_args = [a.detach().double().requires_grad_(i in grad_idx) if a.is_floating_point() else a for i, a in enumerate(args)]
    ref = ref_fn(*ref_args)
    g = torch.randn(ref.shape, device=device, dtype=torch.float64) if ref.dim() else torch.ones((), device=device, dtype=torch.float64)
    refs = [ref] + list(torch.autograd.grad(ref, [ref_args[i] for i in grad_idx], g))
    timing.poison(sorted({r.numel() * 4 for r in refs if r.numel()}, reverse=True) or [4], device)
    ours_args = [a.detach().clone().requires_grad_(i in grad_idx) if a.is_floating_point() else a for i, a in enumerate(args)]
    out = fn(*ours_args)
    got = [out] + list(torch.autograd.grad(out, [ours_args[i] for i in grad_idx], g.to(out.dtype)))
    return timing.compare(got, refs)


def odd_shapes(device, dtypes=(torch.bfloat16,)) -> list[dict]:
    """Every op at odd shapes (bfloat16 by default: the CPU tests cover float32 and float16)."""
    results = []
    gen = torch.Generator(device).manual_seed(7)
    for dtype in dtypes:
        for name, (fn, ref_fn, n_params) in _ops().items():
            for m, n in ODD_SHAPES:
                if n == 1 and n_params:
                    continue  # a norm over one element: dx is pure cancellation (1 - xhat^2), no test of the kernel
                for strided in (False, True) if n in STRIDED else (False,):
                    base = (torch.randn((m, n + 3 if strided else n), device=device, generator=gen) * 2).to(dtype)
                    x = base[:, :n]
                    if name == "cross_entropy":
                        t = torch.randint(0, n, (m,), device=device, generator=gen)
                        t[0] = -100
                        w = None
                        for smoothing in (0.0, 0.1):
                            err = _check(lambda x: K.cross_entropy(x, t, w, label_smoothing=smoothing, reduction="sum"),
                                         lambda x: F.cross_entropy(x, t, w, label_smoothing=smoothing, reduction="sum"), [x], dtype, (0,), device)
                            results.append(_result(name, dtype, (m, n), strided, err, f"smoothing={smoothing}"))
                        continue
                    params = [(torch.randn(n, device=device, generator=gen) + (1.0 if i == 0 else 0.0)).to(dtype) for i in range(n_params)]
                    err = _check(fn, ref_fn, [x, *params], dtype, tuple(range(1 + n_params)), device)
                    results.append(_result(name, dtype, (m, n), strided, err))
    return results


def _result(op, dtype, shape, strided, err, note=""):
    ok = err <= timing.REL_TOL[dtype]
    return {"check": "odd_shape", "op": op, "dtype": str(dtype).replace("torch.", ""), "shape": f"{shape[0]}x{shape[1]}",
            "strided": strided, "rel_err": err, "ok": ok, "note": note}


def big_index(device) -> list[dict]:
    """Inputs past 2^31 elements (bf16): the last rows, where 32-bit offsets would wrap, compared
    with float64 PyTorch on those rows."""
    results = []
    gen = torch.Generator(device).manual_seed(11)
    dtype = torch.bfloat16

    def rows_err(ours, theirs):
        return timing.compare(ours, theirs)

    # row ops: 32769 rows x 65536 = 2^31 + 65536 elements
    m, n = 2**31 // 65536 + 1, 65536
    x = torch.empty((m, n), device=device, dtype=dtype).normal_(generator=gen)
    w = torch.randn(n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, device=device, dtype=dtype, generator=gen)
    tail = slice(m - 3, m)
    for name, fn, ref in (
        ("softmax", lambda t: K.softmax(t, -1), lambda t: torch.softmax(t, -1)),
        ("layer_norm", lambda t: K.layer_norm(t, (n,), w, b), lambda t: F.layer_norm(t, (n,), w.double(), b.double())),
        ("rms_norm", lambda t: K.rms_norm(t, (n,), w), lambda t: F.rms_norm(t, (n,), w.double(), _default_rms_eps(dtype))),
    ):
        xg = x.requires_grad_(True)
        y = fn(xg)
        g = torch.ones_like(y)
        g[tail] = torch.randn((3, n), device=device, dtype=dtype, generator=gen)
        (dx,) = torch.autograd.grad(y, [xg], g)
        xr = x[tail].detach().double().requires_grad_(True)
        yr = ref(xr)
        (dxr,) = torch.autograd.grad(yr, [xr], g[tail].double())
        err = rows_err([y[tail], dx[tail]], [yr, dxr])
        results.append({"check": "over_2^31", "op": name, "dtype": "bfloat16", "shape": f"{m}x{n}", "strided": False,
                        "rel_err": err, "ok": err <= timing.REL_TOL[dtype], "note": "last 3 rows, forward and dx"})
        del y, dx, g
        x.requires_grad_(False)
    del x
    torch.cuda.empty_cache()
    # cross entropy: 16385 rows x 131072 classes
    m, c = 2**31 // 131072 + 1, 131072
    x = torch.empty((m, c), device=device, dtype=dtype).normal_(generator=gen).requires_grad_(True)
    t = torch.randint(0, c, (m,), device=device, generator=gen)
    loss = K.cross_entropy(x, t, reduction="none")
    g = torch.zeros(m, device=device, dtype=dtype)
    g[-3:] = 1.0
    (dx,) = torch.autograd.grad(loss, [x], g)
    xr = x[-3:].detach().double().requires_grad_(True)
    lr = F.cross_entropy(xr, t[-3:], reduction="none")
    (dxr,) = torch.autograd.grad(lr, [xr], torch.ones(3, device=device, dtype=torch.float64))
    err = rows_err([loss[-3:], dx[-3:]], [lr, dxr])
    results.append({"check": "over_2^31", "op": "cross_entropy", "dtype": "bfloat16", "shape": f"{m}x{c}", "strided": False,
                    "rel_err": err, "ok": err <= timing.REL_TOL[dtype], "note": "last 3 rows, loss and dlogits"})
    del x, dx, loss
    torch.cuda.empty_cache()
    # pointwise: a flat 2^31 + 4096 elements
    numel = 2**31 + 4096
    a = torch.empty(numel, device=device, dtype=dtype).normal_(generator=gen).requires_grad_(True)
    bb = torch.empty(numel, device=device, dtype=dtype).normal_(generator=gen)
    y = K.silu_mul(a, bb)
    (da,) = torch.autograd.grad(y, [a], torch.ones_like(y))
    ar = a[-8192:].detach().double().requires_grad_(True)
    yr = F.silu(ar) * bb[-8192:].double()
    (dar,) = torch.autograd.grad(yr, [ar], torch.ones_like(yr))
    err = rows_err([y[-8192:], da[-8192:]], [yr, dar])
    results.append({"check": "over_2^31", "op": "silu_mul", "dtype": "bfloat16", "shape": f"1x{numel}", "strided": False,
                    "rel_err": err, "ok": err <= timing.REL_TOL[dtype], "note": "last 8192 elements, forward and dgate"})
    del a, bb, y, da
    torch.cuda.empty_cache()
    return results


def _default_rms_eps(dtype: torch.dtype) -> float:
    """torch's (and kernelab's) rms_norm eps when none is given: float32's for 16-bit inputs."""
    return torch.finfo(torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype).eps
