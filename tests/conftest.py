"""Shared fixtures: tiny random checkpoints made with transformers, the real tokenizers."""

from __future__ import annotations

import os

import torch

# Triton reads this when it is imported: without a GPU its kernels run in the interpreter
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two workers on CI's two cores: one thread each (and in the servers and
    # engines they start), not two threads each contending for a core
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

from seq2serve.tests.helpers import T5_CONFIGS, make_t5  # noqa: E402

LONG = os.environ.get("SEQ2SERVE_LONG_TESTS") == "1"


# the files that take longest on CI's two cores (`--durations`), run first: `make test`'s two
# workers take whole files in this order, so none is left running one of them at the end
FIRST = ["test_readme.py", "test_reliability.py", "test_tensor_parallel.py",
         "test_notebooks.py", "test_gguf.py", "test_kernel_compile.py", "test_ops.py",
         "test_audio_api.py", "test_server_hardening.py", "test_server.py", "test_lang.py"]


def pytest_collection_modifyitems(config, items):
    """The longest files first (`FIRST`). Tests marked `long` (a minute or so each, whose
    behaviour shorter tests also cover) run with SEQ2SERVE_LONG_TESTS=1 only, to keep `make
    test` within CI's half hour."""
    rank = {name: k for k, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # (stable)
    if LONG:
        return
    skip = pytest.mark.skip(reason="long: SEQ2SERVE_LONG_TESTS=1 runs it")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def t5_checkpoints(tmp_path_factory) -> dict[str, str]:
    """name -> directory, for every config in T5_CONFIGS (made once per session)."""
    root = tmp_path_factory.mktemp("t5")
    return {name: str(make_t5(root / name, **cfg)) for name, cfg in T5_CONFIGS.items()}


@pytest.fixture(scope="session")
def t5_dir(t5_checkpoints) -> str:
    """The default small checkpoint (gated-gelu, untied, mT5 style)."""
    return t5_checkpoints["mt5_gated_untied"]
