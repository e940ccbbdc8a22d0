#!/usr/bin/env bash
# Fill a folder with the torch 2.4.1 wheels (CPython 3.9, Linux x86_64) that the slow test
# tests/routes/test_torch241.py builds its worker venv from: torch-directml pins torch 2.4.1, and
# that test runs xstage's torch worker on it. One download, ~2.7 GB (PyPI's torch 2.4.1 does not
# import without its nvidia-* wheels; the CPU-only index is the smaller choice where reachable).
#
#   scripts/torch241_wheelhouse.sh [DIR]          # default: ./.test-cache/torch241-wheels
#   XSTAGE_TORCH241_WHEELHOUSE=DIR python3 -m pytest --run-slow tests/routes/test_torch241.py
#
# The README's test command never runs this, and never downloads torch 2.4.1.
set -euo pipefail
dir=${1:-.test-cache/torch241-wheels}
mkdir -p "$dir"
python3 -m pip download 'torch==2.4.1' numpy -d "$dir" --python-version 3.9 --only-binary=:all: \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_17_x86_64
ls "$dir"/torch-2.4.1-*.whl
echo "export XSTAGE_TORCH241_WHEELHOUSE=$(cd "$dir" && pwd)"
