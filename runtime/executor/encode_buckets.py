"""Encoder passes padded to a few token counts.

cuBLAS chooses a GEMM's kernel by its shape, and on the lent H200s (torch 2.11, CUDA 13) the
first product of a row count it has not seen costs 2.5-4 ms of host time against 0.1 ms after
(benchmarks/profile_encoder_pass.py, docs/benchmarks.md). An encoder pass's rows are its
inputs' tokens, which under a served load take a new value nearly every pass: OPUS-MT's passes
of 4-24 inputs cost 6-24 ms the first time a size came and 3-6 ms the second. Padding a pass
to one of ~8 sizes an octave (`models/row_buckets.py`: at most 1/8 more tokens) keeps the
shapes few: each is paid once in a server's life. (Padding the rows of every eager GEMM one
product at a time, in models/ops.py, was tried and taken out: its copies cost Llama 8-15 %
under long prefills. A pass padded whole needs no copy per GEMM.)

The padding is whole inputs of at most `PAD_SEGMENT` tokens, none longer than the pass's
longest input (so that no model's position limit is reached), whose outputs are dropped:
their cross K/V go to the scratch page's first slot (page 0: never allocated, written by CUDA
graphs' padded rows too) and their encoder states are cut off before anything reads them.
Only passes of token inputs are padded (an image's or a sound's encoder has its own shapes).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from seq2serve.models.row_buckets import bucket_rows

if TYPE_CHECKING:
    from seq2serve.runtime.executor.worker_batch import EncodeBatch

PAD_SEGMENT = 64  # tokens of a padding input at most


def pad_encode_batch(b: EncodeBatch, limit: int | None = None,
                     pad_id: int = 0) -> tuple[EncodeBatch, int | None]:
    """`b` with its new token inputs padded to `bucket_rows` (padding inputs appended after
    them, their cross K/V slots the scratch slot 0, before the projected inputs' slots), and
    the real token count (the encoder's output rows to keep); (`b`, None) when nothing is
    padded."""
    if b.token_ids is None or b.model_input is not None:
        return b, None
    real = int(b.token_ids.numel())
    pad = bucket_rows(real, limit) - real
    if pad <= 0:
        return b, None
    # (no padding input longer than the pass's longest: a model's position table holds it)
    cap = min(PAD_SEGMENT, max(b.segment_lens))
    lens = [cap] * (pad // cap) + ([pad % cap] if pad % cap else [])
    loc = b.cross_out_loc
    return replace(
        b, token_ids=torch.cat([b.token_ids, b.token_ids.new_full((pad,), pad_id)]),
        segment_lens=[*b.segment_lens, *lens],
        cross_out_loc=torch.cat([loc[:real], loc.new_zeros(pad), loc[real:]])), real
