#!/usr/bin/env bash
# Command 2 of the README: set everything up, then run the test suite (Triton kernels under the interpreter).
. "$(dirname "$0")/_env.sh"
export TRITON_INTERPRET=1
# One pytest worker per core (pytest-xdist), at most 4: every worker holds its own torch, transformers
# and interpreter (~1-2 GB). Each worker's torch gets its share of the cores, not all of them, so
# the workers do not fight over threads. KERNELAB_TEST_WORKERS=0 runs in this process, as plain pytest.
CORES="$(python -c 'import os; print(len(os.sched_getaffinity(0)))')"
WORKERS="${KERNELAB_TEST_WORKERS:-$(( CORES < 4 ? CORES : 4 ))}"
if [ "$WORKERS" -gt 1 ]; then
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( CORES / WORKERS ))}"
    exec python -m pytest -q -n "$WORKERS" --dist worksteal "$@"
fi
exec python -m pytest -q "$@"
