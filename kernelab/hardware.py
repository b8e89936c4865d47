"""What the hardware can do: named profiles for prediction, measured ceilings for measurement.

Profiles give prediction its numbers. The H200 profile holds rates *measured* on an H200 (see
``../BASELINES.md`` of the project and ``benchmarks/results/``); the H100 and A100 profiles are
scaled from their datasheets by the fraction of datasheet bandwidth the H200 copy reached (0.89)
and are labelled as such. When a GPU is present, % of ceiling uses ``measure_ceilings()``, cached
per device and torch version, never a datasheet.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import config


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    arch: tuple[int, int]
    copy_bandwidth: float  # bytes/s, read + write, of a large device-to-device copy
    matmul_flops: dict  # dtype -> FLOP/s of a large GEMM
    launch_us: float  # device time of an empty kernel launch back to back (the floor per kernel)
    eager_op_us: float  # host time eager PyTorch spends per kernel-launching op
    compiled_call_us: float  # host time of one torch.compile'd call (guards, wrapper), small inputs
    source: str

    def pointwise_flops(self) -> float:
        return self.matmul_flops.get("float32", 5e13)


# The H200's numbers, measured on one H200 on 2026-12-02 by `kernelab ceilings` and `kernelab tour`
# (benchmarks/results/ceilings.json, sweep_add_relu_h200.csv): copy bandwidth and 8192^3 GEMM
# rates; host cost per eager op from 2 kernels in ~7 us at n <= 1e5; a torch.compile'd call's
# floor ~20 us at small n.
PROFILES = {
    "h200": DeviceProfile("h200", (9, 0), 4.26e12,
                          {"bfloat16": 6.86e14, "float16": 6.68e14, "float32": 5.1e13, "tfloat32": 3.6e14},
                          2.5, 3.5, 21.0, "measured on an H200, 2026-12-02"),
    "h100": DeviceProfile("h100", (9, 0), 3.35e12 * 0.89,
                          {"bfloat16": 6.86e14, "float16": 6.68e14, "float32": 5.1e13, "tfloat32": 3.6e14},
                          2.5, 3.5, 21.0, "H200 rates with H100 datasheet bandwidth x 0.89"),
    "a100": DeviceProfile("a100", (8, 0), 2.04e12 * 0.89,
                          {"bfloat16": 2.8e14, "float16": 2.8e14, "float32": 1.8e13, "tfloat32": 1.4e14},
                          3.0, 3.5, 21.0, "A100-80GB datasheet x 0.89 (not measured here)"),
}
DEFAULT_PROFILE = "h200"


def get_profile(name: str) -> DeviceProfile:
    try:
        return PROFILES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown device profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None


def profile_for_gpu(gpu_name: str) -> DeviceProfile:
    """The named profile closest to a GPU's name (used for arch-dependent rules on a real GPU)."""
    lowered = gpu_name.lower()
    for key in PROFILES:
        if key in lowered:
            return PROFILES[key]
    return PROFILES[DEFAULT_PROFILE]


# ---------------------------------------------------------------------------------------------
# Measured ceilings (GPU only).


@dataclass
class Ceilings:
    gpu: str
    torch: str
    copy_bandwidth: float  # bytes/s, read + write
    matmul_flops: dict = field(default_factory=dict)  # dtype -> FLOP/s
    date: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def cache_root() -> Path:
    """Where kernelab keeps what it measured or generated: ``$KERNELAB_CACHE`` (default
    ``~/.cache/kernelab``)."""
    return config.cache_root()


def slug(text: str) -> str:
    """``text`` as a file-name part (letters and digits kept, the rest dashes)."""
    return "".join(c if c.isalnum() else "-" for c in text)


def cache_path(gpu: str, torch_version: str) -> Path:
    return cache_root() / f"ceilings-{slug(f'{gpu}-{torch_version}')}.json"


def load_cached_ceilings(path: Path) -> Ceilings | None:
    """The ceilings cached at ``path``; None when there is no file, or (with a warning) when it is
    unreadable or corrupt (cut short, edited, an older format): the caller measures again."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        ceilings = Ceilings(**data)
        if not isinstance(ceilings.copy_bandwidth, (int, float)) or ceilings.copy_bandwidth <= 0 \
                or not isinstance(ceilings.matmul_flops, dict):
            raise ValueError("copy_bandwidth must be a positive number and matmul_flops a mapping")
        return ceilings
    except (OSError, UnicodeDecodeError, ValueError, TypeError) as exc:  # JSONDecodeError is a ValueError
        warnings.warn(f"the cached ceilings file {path} is corrupt ({type(exc).__name__}: {exc}); measuring again "
                      "and rewriting it", stacklevel=3)
        return None


def _bench_ms(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def measure_copy_bandwidth(nbytes: int = 4 << 30) -> float:
    """Device-to-device copy of ``nbytes``: bytes read + written over the median time."""
    import torch

    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ms = _bench_ms(lambda: dst.copy_(src))
    return 2 * nbytes / (ms * 1e-3)


def measure_matmul_flops(dtype_name: str, n: int = 8192) -> float:
    """Rate of an n^3 GEMM on random data (zeros run faster and would flatter the ceiling)."""
    import torch

    dtype = torch.float32 if dtype_name in ("float32", "tfloat32") else getattr(torch, dtype_name)
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype_name == "tfloat32"
    try:
        ms = _bench_ms(lambda: a @ b)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return 2.0 * n**3 / (ms * 1e-3)


def measure_ceilings(refresh: bool = False, progress=None) -> Ceilings:
    """Measure (or load from cache) this GPU's copy bandwidth and GEMM rates."""
    import datetime

    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("measuring ceilings needs a CUDA GPU; none is available")
    gpu = torch.cuda.get_device_name()
    path = cache_path(gpu, torch.__version__)
    cached = None if refresh else load_cached_ceilings(path)
    if cached is not None:
        return cached
    ceilings = Ceilings(gpu, torch.__version__, measure_copy_bandwidth(), {}, datetime.date.today().isoformat())
    for dtype_name in ("float32", "tfloat32", "bfloat16", "float16"):
        if progress:
            progress(dtype_name)
        ceilings.matmul_flops[dtype_name] = measure_matmul_flops(dtype_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(ceilings.to_dict(), indent=2))
    return ceilings


def cached_or_copy_only() -> Ceilings:
    """Ceilings for % figures during a measurement: the cache, else a quick copy measurement."""
    import datetime

    import torch

    gpu = torch.cuda.get_device_name()
    path = cache_path(gpu, torch.__version__)
    cached = load_cached_ceilings(path)
    if cached is not None:
        return cached
    if path.exists():  # corrupt (warned): rebuild it in full, as `kernelab ceilings --refresh` would
        return measure_ceilings(refresh=True)
    return Ceilings(gpu, torch.__version__, measure_copy_bandwidth(1 << 30), {}, datetime.date.today().isoformat())
