"""The sampler's race as one Triton kernel (runtime/kernels/triton_race.py) against the torch
race of seeded_race.py, draw for draw: the same noise, the same blocks, the same tokens, on
flat and peaked rows, filtered rows (zeros), vocabularies that do and do not fill their last
block, and seeded keys. Without a GPU the kernel runs in Triton's interpreter (conftest.py)."""

from __future__ import annotations

import os

import pytest
import torch

from seq2serve.runtime.executor.seeded_race import block_size, race, row_key
from seq2serve.runtime.kernels.triton_race import race_kernel

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


def _draws(weights: torch.Tensor, keys: torch.Tensor) -> tuple[list[int], list[int]]:
    k = block_size(weights.shape[-1])
    kernel = race_kernel(weights.to(DEVICE), keys.to(DEVICE), k, blocks=4).cpu().tolist()
    return kernel, race(weights, keys).tolist()


@pytest.mark.parametrize("vocab", [1000, 1024, 5003])
@pytest.mark.parametrize("scale", [0.5, 4.0], ids=["flat", "peaked"])
def test_kernel_draws_what_the_torch_race_draws(vocab, scale):
    g = torch.Generator().manual_seed(vocab)
    weights = torch.softmax(torch.randn(16, vocab, generator=g) * scale, -1)
    keys = torch.randint(0, 1 << 32, (16,), generator=g)
    kernel, torch_race = _draws(weights, keys)
    assert kernel == torch_race
    assert len(set(kernel)) > 1  # (different keys draw different tokens)


def test_filtered_rows_and_seeded_keys():
    """Zeros (a top-p cut) never win; a seeded row's key gives its token in any batch."""
    g = torch.Generator().manual_seed(1)
    weights = torch.softmax(torch.randn(8, 3000, generator=g), -1)
    weights[:, 1500:] = 0.0  # every row's second half filtered out
    weights[3, :] = 0.0
    weights[3, 2999] = 1.0  # one token left, in the last (shorter) block
    keys = torch.tensor([row_key(seed, step) for seed, step in
                         [(7, 0), (7, 1), (8, 0), (9, 5), (2**40 + 3, 2), (0, 0), (1, 1), (5, 9)]])
    kernel, torch_race = _draws(weights, keys)
    assert kernel == torch_race
    assert kernel[3] == 2999 and all(t < 1500 for i, t in enumerate(kernel) if i != 3)
    alone = race_kernel(weights[4:5].to(DEVICE), keys[4:5].to(DEVICE), block_size(3000))
    assert alone.item() == kernel[4]


def test_frequencies_follow_the_weights():
    """Many keys over one small row: each token drawn in proportion to its weight."""
    weights = torch.tensor([[0.5, 0.25, 0.125, 0.125, 0.0]]).repeat(400, 1)
    keys = torch.randint(0, 1 << 32, (400,), generator=torch.Generator().manual_seed(3))
    drawn = race_kernel(weights.to(DEVICE), keys.to(DEVICE), block_size(5)).cpu()
    freq = torch.bincount(drawn, minlength=5).float() / 400
    assert torch.allclose(freq, weights[0], atol=0.06), freq.tolist()


@pytest.mark.gpu
def test_every_check_on_the_gpu_and_llama_vocabulary():
    """The gate's run (`-m gpu`) of this file's checks on CUDA, and 64 rows of Llama 3's
    vocabulary drawn as torch's race draws them on the same device."""
    if DEVICE != "cuda":
        pytest.skip("needs CUDA (the CPU suite runs the checks above in the interpreter)")
    for vocab in (1000, 1024, 5003):
        for scale in (0.5, 4.0):
            test_kernel_draws_what_the_torch_race_draws(vocab, scale)
    test_filtered_rows_and_seeded_keys()
    test_frequencies_follow_the_weights()
    g = torch.Generator(device="cuda").manual_seed(0)
    weights = torch.softmax(torch.randn(64, 128256, device="cuda", generator=g) * 3, -1)
    keys = torch.randint(0, 1 << 32, (64,), device="cuda", generator=g)
    drawn = race_kernel(weights, keys, block_size(128256))
    assert torch.equal(drawn, race(weights, keys))
