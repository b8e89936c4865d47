#!/usr/bin/env bash
# Command 2 of the README: set everything up, then run the test suite (Triton kernels under the interpreter).
if [ -n "${KERNELAB_TEST_WORKERS+x}" ] && ! [[ "$KERNELAB_TEST_WORKERS" =~ ^[0-9]+$ ]]; then
    echo "scripts/test.sh: KERNELAB_TEST_WORKERS must be a whole number of pytest workers (0: one process), not '$KERNELAB_TEST_WORKERS'" >&2
    exit 2
fi
. "$(dirname "$0")/_env.sh"
export TRITON_INTERPRET=1
# One pytest worker per core (pytest-xdist), at most 4: every worker holds its own torch, transformers
# and interpreter (~1-2 GB). KERNELAB_TEST_WORKERS=0 runs in this process, as plain pytest. Torch's
# threads are left as they are: eager's CPU convolutions sum in another order on one thread, and the
# float32 comparisons with eager were set on its default (OMP_NUM_THREADS=1 moves a channels-last
# batch-norm test's bias gradient 2.4e-5 past its tolerance).
CORES="$(python -c 'import os; print(len(os.sched_getaffinity(0)))')"
WORKERS="${KERNELAB_TEST_WORKERS:-$(( CORES < 4 ? CORES : 4 ))}"
if [ "$WORKERS" -gt 1 ]; then
    exec python -m pytest -q -n "$WORKERS" --dist worksteal "$@"
fi
exec python -m pytest -q "$@"
