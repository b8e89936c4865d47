"""Memory traffic: bytes each kernel moves, round trips, and the ideal fully fused traffic.

Units follow the tutorial: a *transfer* is one pass over the largest array the function reads or
writes. ``(a + b).relu()`` eagerly: add reads a and b and writes t (3), relu reads t and writes the
result (2): 5 transfers. Fused: read a, b, write the result: 3. The difference is the *round trip*
of t, written by one kernel and read back by the next.
"""
from __future__ import annotations

from dataclasses import dataclass

from .capture import OpTrace, TensorInfo
from .eager_rules import KernelSpec


def unique_bytes(tensors: list[TensorInfo]) -> int:
    """Bytes spanned by a kernel's operands, each distinct region counted once."""
    seen = {}
    for t in tensors:
        seen.setdefault(t.region, t.footprint)
    return sum(seen.values())


def kernel_bytes(spec: KernelSpec) -> tuple[int, int]:
    """(bytes read, bytes written) of one kernel: its compulsory traffic (its share of the op's)."""
    return unique_bytes(spec.reads) // spec.share, unique_bytes(spec.writes) // spec.share


@dataclass
class RoundTrip:
    """A value one kernel writes to memory and a later kernel reads back."""

    storage: int
    shape: tuple[int, ...]
    dtype: str
    writer: int  # index of the writing kernel
    readers: list[int]  # indices of the kernels that read it back
    bytes: int  # bytes written plus bytes read back

    def to_dict(self) -> dict:
        return {"storage": self.storage, "shape": list(self.shape), "dtype": self.dtype,
                "writer": self.writer, "readers": self.readers, "bytes": self.bytes}

    @classmethod
    def from_dict(cls, d: dict) -> "RoundTrip":
        return cls(d["storage"], tuple(d["shape"]), d["dtype"], d["writer"], list(d["readers"]), d["bytes"])


def round_trips(kernels: list[KernelSpec]) -> list[RoundTrip]:
    """Every (storage, version) written by one kernel and read by a later one."""
    last_writer: dict[int, tuple[int, TensorInfo]] = {}
    trips: dict[tuple[int, int], RoundTrip] = {}
    for i, spec in enumerate(kernels):
        for t in {r.region: r for r in spec.reads}.values():
            if t.storage not in last_writer:
                continue
            w, written = last_writer[t.storage]
            key = (t.storage, w)
            if key not in trips:
                trips[key] = RoundTrip(t.storage, written.shape, written.dtype, w, [], written.footprint)
            if i not in trips[key].readers:
                trips[key].readers.append(i)
                trips[key].bytes += t.footprint
        for t in spec.writes:
            last_writer[t.storage] = (i, t)
    return list(trips.values())


def largest_array_bytes(trace: OpTrace, kernels: list[KernelSpec]) -> int:
    """The tutorial's unit: the largest array the function takes or gives back."""
    candidates = [t.footprint for t in trace.inputs + trace.outputs]
    if not candidates or max(candidates) == 0:
        candidates = [t.footprint for k in kernels for t in k.reads + k.writes] or [0]
    return max(candidates)


def implicit_inputs(kernels: list[KernelSpec]) -> set[int]:
    """Storages read before any kernel wrote them: inputs the function did not receive as
    arguments (tensors captured by a closure, a module's parameters used through a global)."""
    written, read_first = set(), set()
    for spec in kernels:
        read_first |= {t.storage for t in spec.reads if t.storage not in written}
        written |= {t.storage for t in spec.writes}
    return read_first


def ideal_bytes(trace: OpTrace, kernels: list[KernelSpec]) -> int:
    """Fully fused traffic: each input the kernels read, read once; each output written once."""
    input_storages = {t.storage for t in trace.inputs} | implicit_inputs(kernels)
    read = {}
    for spec in kernels:
        for t in spec.reads:
            if t.storage in input_storages:
                read[t.storage] = max(read.get(t.storage, 0), t.footprint)
    written = {}
    for t in trace.outputs:
        written[t.storage] = max(written.get(t.storage, 0), t.footprint)
    return sum(read.values()) + sum(written.values())


def bytes_over_ideal(trace: OpTrace, kernels: list[KernelSpec]) -> list[int]:
    """Per kernel, the bytes it moves beyond its part of the ideal traffic: the ideal reads each
    input once (credited to the first kernel reading it) and writes each output once (credited to
    the last kernel writing it); every other byte -- an intermediate written or read back, an input
    read again -- is over ideal. Their sum is about ``bytes - ideal_bytes`` (the ideal counts a
    tensor's largest view once). The pieces of one op split for 32-bit indexing share its credit."""
    inputs = {t.storage for t in trace.inputs} | implicit_inputs(kernels)
    outputs = {t.storage for t in trace.outputs}
    first = _first_pieces(kernels)
    last_writer = {t.storage: first[i] for i, spec in enumerate(kernels) for t in spec.writes if t.storage in outputs}
    read_before: set[int] = set()
    ideal_of: dict[int, int] = {}
    over = []
    for i, spec in enumerate(kernels):
        if first[i] not in ideal_of:
            reads = {t.region: t for t in spec.reads}.values()
            ideal = sum(t.footprint for t in reads if t.storage in inputs and t.storage not in read_before)
            read_before |= {t.storage for t in reads}
            writes = {t.region: t for t in spec.writes}.values()
            ideal_of[i] = ideal + sum(t.footprint for t in writes if last_writer.get(t.storage) == i)
        read, written = kernel_bytes(spec)
        over.append(max(read + written - ideal_of[first[i]] // spec.share, 0))
    return over


def _first_pieces(kernels: list[KernelSpec]) -> list[int]:
    """For each kernel, the index of the first piece of its op (itself unless it continues a split)."""
    first = []
    for i, spec in enumerate(kernels):
        prev = kernels[i - 1] if i else None
        same = prev is not None and spec.share > 1 and prev.share == spec.share and \
            prev.reads == spec.reads and prev.writes == spec.writes
        first.append(first[-1] if same else i)
    return first
