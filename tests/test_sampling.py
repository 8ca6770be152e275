"""Sampling parameters, the sampler against HF's logits processors, seeds and stop conditions."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.runtime.executor.sampler import Sampler
from seq2serve.runtime.executor.sampling_batch import SamplingBatch
from seq2serve.runtime.scheduler.req import Req
from seq2serve.tests.helpers import SOURCES, hf_greedy, make_scheduler, request, run_to_completion

VOCAB = 50


@pytest.mark.parametrize("params, field", [
    ({"temperature": -1}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -5}, "top_k"),
    ({"top_k": 2.5}, "top_k"),
    ({"min_p": 2}, "min_p"),
    ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"max_new_tokens": True}, "max_new_tokens"),
    ({"min_new_tokens": 9, "max_new_tokens": 4}, "min_new_tokens"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"frequency_penalty": 3}, "frequency_penalty"),
    ({"presence_penalty": -2.5}, "presence_penalty"),
    ({"n": 0}, "n"),
    ({"seed": -1}, "seed"),
    ({"stop": ""}, "stop"),
    ({"stop": [1, 2]}, "stop"),
    ({"stop_token_ids": ["a"]}, "stop_token_ids"),
    ({"ignore_eos": "yes"}, "ignore_eos"),
    ({"temprature": 0.5}, "temprature"),
    ({"temperature": float("nan")}, "temperature"),
])
def test_bad_sampling_params_name_the_field(params, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams.from_dict(params)


def test_stop_token_ids_checked_against_vocab():
    with pytest.raises(ValueError, match="stop_token_ids"):
        SamplingParams.from_dict({"stop_token_ids": [VOCAB]}).validate(VOCAB)


def _batch(params: list[dict], outputs: list[list[int]] | None = None,
           prompts: list[list[int]] | None = None) -> SamplingBatch:
    reqs = []
    prompts = prompts or [[0]] * len(params)
    outputs = outputs or [[]] * len(params)
    for i, p in enumerate(params):
        r = Req(rid=str(i), encoder_input_ids=[], decoder_input_ids=prompts[i],
                sampling_params=SamplingParams.from_dict(p))
        r.output_ids = list(outputs[i])
        reqs.append(r)
    return SamplingBatch.from_reqs(reqs, VOCAB, eos_ids=(1,), device="cpu")


def _support(probs: torch.Tensor) -> set[int]:
    return set(torch.nonzero(probs > 0).flatten().tolist())


@pytest.mark.parametrize("trial", range(5))
def test_top_k_top_p_min_p_keep_what_hf_keeps(trial):
    from transformers import MinPLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    from seq2serve.runtime.executor.token_filter import filter_probs as _filter

    g = torch.Generator().manual_seed(trial)
    logits = torch.randn(1, VOCAB, generator=g) * 3
    probs = torch.softmax(logits, -1)
    for params, warper in (({"top_k": 7}, TopKLogitsWarper(7)),
                           ({"top_p": 0.8}, TopPLogitsWarper(0.8)),
                           ({"min_p": 0.05}, MinPLogitsWarper(0.05))):
        ours = _filter(probs.clone(), _batch([{"temperature": 1.0, **params}]))
        ref = torch.softmax(warper(None, logits.clone()), -1)
        assert _support(ours[0]) == _support(ref[0]), params


def test_repetition_penalty_matches_hf():
    from transformers import RepetitionPenaltyLogitsProcessor

    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(0)) * 4
    seen = [[0, 5, 9], [0, 7, 7, 12]]
    ref = RepetitionPenaltyLogitsProcessor(1.3)(
        torch.tensor([seen[0] + [0], seen[1]]), logits.clone())
    ours = _apply(logits, _batch([{"repetition_penalty": 1.3}] * 2,
                                 outputs=[s[1:] for s in seen], prompts=[[0], [0]]))
    torch.testing.assert_close(ours, ref)


def test_frequency_and_presence_penalties_follow_openai():
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(1))
    out = [4, 4, 4, 8]
    ours = _apply(logits, _batch([{"frequency_penalty": 0.5, "presence_penalty": 0.25}],
                                 outputs=[out]))
    expected = logits.clone()
    expected[0, 4] -= 3 * 0.5 + 0.25
    expected[0, 8] -= 1 * 0.5 + 0.25
    torch.testing.assert_close(ours, expected)


def _apply(logits, sb):
    from seq2serve.runtime.executor.sampler import _apply_penalties

    return _apply_penalties(logits.clone(), sb)


@pytest.mark.parametrize("seeded", [False, True])
def test_sampling_follows_the_distribution(seeded):
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0] + [-30.0] * (VOCAB - 5)])
    p = torch.softmax(logits / 0.8, -1)[0, :5]
    n = 4000
    params = [{"temperature": 0.8, **({"seed": s} if seeded else {})} for s in range(n)]
    ids = Sampler()(logits.expand(n, -1), _batch(params)).next_token_ids
    freq = torch.bincount(ids, minlength=VOCAB)[:5].float() / n
    assert ids.max() < 5
    # 4000 draws: each frequency within ~4 standard deviations of its probability
    assert torch.all((freq - p).abs() < 4 * torch.sqrt(p * (1 - p) / n) + 1e-3), (freq, p)


def test_seeded_noise_depends_only_on_seed_and_step():
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(2))
    a = Sampler()(logits, _batch([{"temperature": 1.0, "seed": s} for s in (7, 8, 9)]))
    b = Sampler()(logits[[2, 0]], _batch([{"temperature": 1.0, "seed": s} for s in (9, 7)]))
    assert a.next_token_ids[[2, 0]].tolist() == b.next_token_ids.tolist()


@pytest.fixture(scope="module")
def sources(t5_dir):
    tok = load_tokenizer(t5_dir)
    return [tok(s).input_ids for s in SOURCES]


def test_seeded_generation_reproducible_and_top_k_1_is_greedy(t5_dir, sources):
    def run(batch_sources, **sp):
        sched = make_scheduler(t5_dir)
        for i, ids in batch_sources:
            sched.add_request(request(str(i), ids, max_new_tokens=10, ignore_eos=True, **sp))
        return run_to_completion(sched)

    sampled = {"temperature": 1.5, "seed": 1234}
    together = run(list(enumerate(sources)), **sampled)
    alone = run([(3, sources[3])], **sampled)
    again = run(list(enumerate(sources[:5])), **sampled)
    assert together["3"] == alone["3"] == again["3"]
    assert together["3"] != hf_greedy(t5_dir, sources[3], 10)  # it really sampled
    other_seed = run([(3, sources[3])], temperature=1.5, seed=99)
    assert other_seed["3"] != alone["3"]
    top1 = run(list(enumerate(sources)), temperature=1.5, top_k=1)
    for i, ids in enumerate(sources):
        assert top1[str(i)] == hf_greedy(t5_dir, ids, 10)


def test_stop_token_ids_and_stop_strings(t5_dir, sources):
    tok = load_tokenizer(t5_dir)
    ref = hf_greedy(t5_dir, sources[0], 12)
    sched = make_scheduler(t5_dir)
    stop_id = ref[4]
    sched.add_request(request("ids", sources[0], max_new_tokens=12, stop_token_ids=[stop_id]))
    text = tok.decode(ref[:8], skip_special_tokens=True)
    stop_str = text[len(tok.decode(ref[:5], skip_special_tokens=True)):].strip()[:4]
    sched.add_request(request("str", sources[0], max_new_tokens=12, stop=[stop_str]))
    sched.add_request(request("len", sources[0], max_new_tokens=6))
    reasons = {}
    out = {}
    while sched.has_work:
        for o in sched.step():
            out.setdefault(o.rid, []).extend(o.new_token_ids)
            if o.finished_reason:
                reasons[o.rid] = o.finished_reason
    assert reasons["ids"] == {"type": "stop", "matched": stop_id}
    assert out["ids"] == ref[: ref.index(stop_id) + 1]
    assert reasons["str"] == {"type": "stop", "matched": stop_str}
    assert stop_str in tok.decode(out["str"], skip_special_tokens=True)
    assert stop_str not in tok.decode(out["str"][:-1], skip_special_tokens=True)
    assert reasons["len"] == {"type": "length"} and out["len"] == ref[:6]


def test_eos_and_min_new_tokens(t5_dir, sources, tmp_path):
    ref = hf_greedy(t5_dir, sources[1], 12)
    eos = ref[3]
    path = tmp_path / "eos"
    shutil.copytree(t5_dir, path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["eos_token_id"] = eos
    (path / "config.json").write_text(json.dumps(cfg))
    sched = make_scheduler(str(path))
    sched.add_request(request("eos", sources[1], max_new_tokens=12))
    sched.add_request(request("ignore", sources[1], max_new_tokens=12, ignore_eos=True))
    sched.add_request(request("min", sources[1], max_new_tokens=12, min_new_tokens=8))
    out = run_to_completion(sched)
    assert out["eos"] == ref[: ref.index(eos) + 1]
    assert out["ignore"] == ref
    assert len(out["min"]) >= 8 and eos not in out["min"][:8]


@pytest.mark.parametrize("params", [
    [{"temperature": 0}, {"temperature": 0}],
    [{"temperature": 0.7, "top_k": 5, "seed": 1}, {"temperature": 0}],
    [{"temperature": 0, "repetition_penalty": 1.3, "presence_penalty": 0.4}] * 2,
])
def test_strided_logits_sample_as_contiguous(params):
    """A padded LM head hands the sampler a view whose rows are wider than the vocabulary
    (`TritonOps.logits`): every path samples from it what it samples from the same logits
    made contiguous, and the log-probs are equal."""
    gen = torch.Generator().manual_seed(5)
    wide = torch.randn(len(params), VOCAB + 13, generator=gen)
    view = wide[:, :VOCAB]
    assert not view.is_contiguous()
    outputs = [[3, 4, 3]] * len(params)
    sb = _batch(params, outputs)
    sb.want_logprobs, sb.top_logprobs_num = True, 2
    got = Sampler((2,))(view, sb)
    want = Sampler((2,))(view.contiguous(), _batch(params, outputs))
    assert torch.equal(got.next_token_ids, want.next_token_ids)
    assert torch.equal(got.logprobs, Sampler((2,))(view.contiguous(), sb).logprobs)
    assert torch.equal(got.top_logprob_ids, Sampler((2,))(view.contiguous(), sb).top_logprob_ids)
    assert torch.equal(view, wide[:, :VOCAB])  # (the model's logits left as they were)
