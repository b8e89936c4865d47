#!/usr/bin/env bash
# Command 1 of the README: set everything up, then run the main job on the built-in example.
. "$(dirname "$0")/_env.sh"
kernelab tour "$@"
