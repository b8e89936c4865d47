#!/usr/bin/env python
"""A py-spy raw (folded) profile summarized per thread: where the steps' samples went, leaving out
the compile (stacks with a frame whose function's name says ``compile``).

    py-spy record --threads --idle -f raw -o prof.txt -- python benchmarks/zoo_profile.py ... --loop 20
    python benchmarks/folded_summary.py prof.txt [--top 30] > summary.txt

Per thread: its samples, the frames that were sampled running (leaves: own time) and the functions
on the stack (inclusive time), most first. With ``--idle`` a thread blocked in C (waiting for the
GIL, a lock or the driver) is sampled too: its leaf is the Python line that called into C.
"""
from __future__ import annotations

import argparse
import collections
import re


def _frames(stack: str) -> list[str]:
    return stack.split(";")


def _thread_of(frames: list[str]) -> str:
    return frames[0] if frames and frames[0].startswith(("thread", "process")) else "?"


def summarize(path: str, top: int) -> str:
    leaves: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    inclusive: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    totals: collections.Counter = collections.Counter()
    skipped = 0
    with open(path) as fh:
        for line in fh:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not count.isdigit():
                continue
            n = int(count)
            frames = _frames(stack)
            if any(re.match(r"[^(]*compile", f) for f in frames):
                skipped += n
                continue
            thread = _thread_of(frames)
            code = [f for f in frames if f != thread]
            totals[thread] += n
            if code:
                leaves[thread][code[-1]] += n
            for f in set(code):
                inclusive[thread][f] += n
    out = [f"{path}: {sum(totals.values())} samples outside compiles ({skipped} in them)"]
    for thread, total in totals.most_common():
        out.append(f"== {thread}: {total} samples")
        out.append("  leaves (own samples):")
        out += [f"  {n:7d} {100 * n / total:5.1f}%  {f[:170]}" for f, n in leaves[thread].most_common(top)]
        out.append("  on the stack (inclusive):")
        out += [f"  {n:7d} {100 * n / total:5.1f}%  {f[:170]}" for f, n in inclusive[thread].most_common(top)]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folded")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    print(summarize(args.folded, args.top))


if __name__ == "__main__":
    main()
