#!/usr/bin/env bash
# Command 2 of the README: set everything up, then run the test suite (Triton kernels under the interpreter).
. "$(dirname "$0")/_env.sh"
export TRITON_INTERPRET=1
python -m pytest -q "$@"
