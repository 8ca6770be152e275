#!/usr/bin/env bash
# The wheels a lent GPU machine lacks (it has torch, triton, transformers, numpy, pytest, but
# no network and none of the runtime's other dependencies), downloaded here into .whl/ for
# `run(carry=[".whl"])`; benchmarks/gpu_setup.sh installs them there. Versions are this
# checkout's virtualenv's, one of each; the device's Python is 3.12 on x86_64.
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS=(pyzmq fastapi starlette uvicorn h11 click anyio sniffio pydantic pydantic_core
      annotated_types annotated_doc typing_inspection httpx httpcore opentelemetry_api
      httptools uvloop python_multipart sentencex py3langid soundfile soxr cffi pycparser py_spy
      xgrammar apache_tvm_ffi llguidance)
pins=()
for p in "${PKGS[@]}"; do
    v=$(.venv/bin/python -m pip show "$p" 2>/dev/null | awk '/^Version:/{print $2}' || true)
    pins+=("$p${v:+==$v}")
done
mkdir -p .whl
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${pins[@]}"
ls .whl
