"""The on-disk cache of generated kernels: one file per source, imported once per process.

Kernels are written to ``$KERNELAB_CACHE/compiler`` (default ``~/.cache/kernelab/compiler``) as
``<name>_<source hash>.py`` and imported from there; Triton caches the binaries by source hash.
A file that is not its source byte for byte (truncated, edited) is rewritten with a warning.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import warnings

from ..hardware import cache_root

__all__ = ["cache_dir", "kernel_module", "forget_imports"]


def cache_dir() -> str:
    return str(cache_root() / "compiler")


_MODULES: dict = {}


def kernel_module(source: str, name: str):
    """Import the generated source from the on-disk cache (written once per source hash)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    if digest in _MODULES:
        return getattr(_MODULES[digest], name)
    path = os.path.join(cache_dir(), f"{name}_{digest}.py")
    if not _cached_source_matches(path, source):
        os.makedirs(cache_dir(), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(source)
        os.replace(tmp, path)  # atomic: concurrent compiles never read half a file
    spec = importlib.util.spec_from_file_location(f"kernelab_generated_{digest}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _MODULES[digest] = module
    return getattr(module, name)


def _cached_source_matches(path: str, source: str) -> bool:
    """Whether the cache file holds exactly ``source``. A truncated or edited file is often still
    valid Python (cut in a trailing comment, a missing last store) and would compute garbage with
    no error, so a file that is not the source, byte for byte, is rewritten with a warning."""
    try:
        with open(path) as f:
            cached = f.read()
    except FileNotFoundError:
        return False
    except (OSError, UnicodeDecodeError):
        cached = None
    if cached == source:
        return True
    warnings.warn(f"kernelab: the cached kernel {path} does not match its source hash (truncated or "
                  "modified): rebuilt", RuntimeWarning, stacklevel=3)
    return False


def forget_imports() -> None:
    """Drop this process's imported kernels: the next ``kernel_module`` reads the disk again, as a
    new process would."""
    _MODULES.clear()
