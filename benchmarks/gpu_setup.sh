# Sourced at the start of every command on the lent GPU machine (which has no pyzmq and no
# package install of seq2serve): carried wheels (benchmarks/gpu_wheels.sh downloads them into
# .whl/), the package on PYTHONPATH, versions.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >/dev/null 2>&1
mkdir -p /tmp/pkg && ln -sfn "$PWD" /tmp/pkg/seq2serve
export PYTHONPATH=/tmp/pkg:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
