#!/usr/bin/env bash
# The GPU check (scripts/gpu_check.py says what it runs), on a lent GPU machine with the
# wheels of benchmarks/gpu_setup.sh carried in .whl/. Arguments go to gpu_check.py.
cd "$(dirname "$0")/.." || exit 1
source benchmarks/gpu_setup.sh
exec python3 scripts/gpu_check.py "$@"
