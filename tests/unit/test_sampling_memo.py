"""The sampling columns kept across steps (runtime/executor/sampling_columns.py): a batch made
with the memo equals the batch made from scratch, step after step, while its rows stay, change
order, are replaced, and generate tokens; the memo holds no row once cleared."""

from __future__ import annotations

import gc
import random
import weakref

import pytest
import torch

from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.executor.sampling_batch import SamplingBatch
from seq2serve.runtime.executor.sampling_columns import SamplingMemo
from seq2serve.runtime.scheduler.req import Req

VOCAB = 64
PARAMS = [
    {"temperature": 0},
    {"temperature": 0.7, "top_k": 5},
    {"temperature": 1.0, "top_p": 0.8, "seed": 3},
    {"temperature": 0.9, "min_p": 0.1, "seed": 11},
    {"temperature": 0, "repetition_penalty": 1.3, "presence_penalty": 0.5},
    {"temperature": 0, "min_new_tokens": 3, "max_new_tokens": 6},
    {"temperature": 0, "no_repeat_ngram_size": 2},
    {"num_beams": 3, "max_new_tokens": 5},
]
# (keys: random for unseeded sampled rows, compared where seeded only)
FIELDS = [f for f in SamplingBatch.__dataclass_fields__ if f != "keys"]


def _req(i: int, rng: random.Random, shared: dict) -> Req:
    # rows of one "group" share their params object, as a beam group's rows do
    key = rng.randrange(len(PARAMS))
    sp = shared.setdefault(key, SamplingParams.from_dict(PARAMS[key]))
    r = Req(rid=str(i), encoder_input_ids=[], decoder_input_ids=[0], sampling_params=sp,
            return_logprob=rng.random() < 0.2, top_logprobs_num=rng.choice([0, 2]))
    r.output_ids = [rng.randrange(2, VOCAB) for _ in range(rng.randrange(4))]
    return r


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b))
    return a == b


def _batch(reqs, memo, pending=0):
    return SamplingBatch.from_reqs(reqs, VOCAB, (1,), "cpu", pending=pending,
                                   forced_eos=(1,), memo=memo)


def test_a_batch_made_with_the_memo_is_the_batch_made_from_scratch_step_after_step():
    rng = random.Random(0)
    memo, shared = SamplingMemo(), {}
    reqs = [_req(i, rng, shared) for i in range(12)]
    made = 0
    for step in range(60):
        what = rng.random()
        if what < 0.15:  # the same rows, another order
            reqs = rng.sample(reqs, len(reqs))
        elif what < 0.3:  # one row leaves, another joins
            reqs[rng.randrange(len(reqs))] = _req(100 + step, rng, shared)
        elif what < 0.35:  # the same rows' params objects, new rows around them
            reqs = [_req(200 + step * 20 + i, rng, shared) for i in range(len(reqs))]
        for r in reqs:  # every row generates a token
            r.output_ids.append(rng.randrange(2, VOCAB))
        pending = rng.choice([0, 1])
        before = memo.hits
        got, want = _batch(reqs, memo, pending), _batch(reqs, None, pending)
        made += memo.hits == before
        for f in FIELDS:
            assert _same(getattr(got, f), getattr(want, f)), (step, f)
        assert (got.keys is None) == (want.keys is None)
    assert memo.hits > 30 and made > 10  # both paths taken


def test_seeded_rows_draw_the_same_keys_with_the_memo():
    memo = SamplingMemo()
    sp = SamplingParams.from_dict({"temperature": 1.0, "seed": 5})
    reqs = [Req(rid=str(i), encoder_input_ids=[], decoder_input_ids=[0], sampling_params=sp)
            for i in range(3)]
    for _ in range(3):
        for r in reqs:
            r.output_ids.append(4)
        assert torch.equal(_batch(reqs, memo).keys, _batch(reqs, None).keys)
    assert memo.hits == 2


@pytest.mark.parametrize("change", ["order", "replace", "shorter"])
def test_other_rows_are_not_given_the_kept_columns(change):
    memo = SamplingMemo()
    greedy = SamplingParams.from_dict({"temperature": 0})
    hot = SamplingParams.from_dict({"temperature": 0.5, "top_k": 3})
    reqs = [Req(rid=str(i), encoder_input_ids=[], decoder_input_ids=[0],
                sampling_params=greedy if i % 2 else hot) for i in range(4)]
    first = _batch(reqs, memo)
    if change == "order":
        reqs = reqs[::-1]
    elif change == "replace":
        reqs[0] = Req(rid="x", encoder_input_ids=[], decoder_input_ids=[0],
                      sampling_params=greedy)
    else:
        reqs = reqs[:3]
    second = _batch(reqs, memo)
    assert memo.hits == 0
    assert second.greedy.tolist() == [r.sampling_params is greedy for r in reqs]
    assert first.greedy.tolist() == [False, True, False, True]


def test_the_scheduler_lets_go_of_the_rows_when_idle():
    memo = SamplingMemo()
    r = Req(rid="0", encoder_input_ids=[], decoder_input_ids=[0],
            sampling_params=SamplingParams.from_dict({"temperature": 0}))
    ref = weakref.ref(r)
    _batch([r], memo)
    del r
    gc.collect()
    assert ref() is not None  # kept while it may come again
    memo.clear()
    gc.collect()
    assert ref() is None
