"""Scoring given decoder tokens (`return_logprob` + `logprob_start_len`, max_new_tokens 0 to
score only): the log-probabilities match Hugging Face's float32 log_softmax of its logits, for
T5 (a forced decoder continuation under the encoder input) and Llama (a prompt's
continuation), batched with ordinary requests, over cached prefixes, and every slot freed."""

from __future__ import annotations

import pytest
import torch

from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.runtime.messages.io_struct import TokenizedRequest
from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint
from seq2serve.tests.helpers import SOURCES, hf_greedy, hf_logits, make_scheduler

TOL = 1e-4


def scoring(rid: str, enc: list[int], dec: list[int], start: int, max_new: int = 0,
            stream: bool = False) -> TokenizedRequest:
    sp = SamplingParams.from_dict({"temperature": 0, "max_new_tokens": max_new,
                                   "ignore_eos": True})
    return TokenizedRequest(rid=rid, encoder_input_ids=enc, decoder_input_ids=dec,
                            sampling_params=sp, return_logprob=True, logprob_start_len=start,
                            stream=stream)


def drive(sched) -> dict[str, dict]:
    """Step until idle: rid -> {"ids", "input_logprobs", "cached"}."""
    out: dict[str, dict] = {}
    while sched.has_work:
        for o in sched.step():
            r = out.setdefault(o.rid, {"ids": [], "input_logprobs": None})
            r["ids"] += o.new_token_ids
            if o.input_logprobs is not None:
                r["input_logprobs"] = o.input_logprobs
            r["cached"] = o.cached_tokens
        sched.check_integrity()
    return out


def reference(logits: torch.Tensor, ids: list[int], start: int) -> list[float | None]:
    """HF's log-prob of ids[p] after ids[:p], for p >= start (None at p = 0)."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    return [None if p == 0 else lp[p - 1, ids[p]].item() for p in range(start, len(ids))]


def assert_close(got: list, want: list) -> None:
    assert len(got) == len(want)
    assert (got[0] is None) == (want[0] is None) if want else True
    g = torch.tensor([x for x in got if x is not None])
    w = torch.tensor([x for x in want if x is not None])
    torch.testing.assert_close(g, w, atol=TOL, rtol=0)


def test_t5_forced_decoder_scores_match_hf(t5_dir):
    tok = load_tokenizer(t5_dir)
    sched = make_scheduler(t5_dir, page_size=4)
    cases = []  # (rid, encoder ids, decoder ids, start, max_new)
    for i, src in enumerate(SOURCES[:4]):
        enc = tok(src).input_ids
        for j, label in enumerate(["positive", "negative", "a much longer label text"]):
            dec = [0] + tok(label).input_ids  # with its </s>: the whole output is scored
            # the long label: scored from position 5, so a cached page (4 tokens) can serve
            cases.append((f"{i}-{j}", enc, dec, 5 if j == 2 else (i + j) % 2, 3 if j == 2 else 0))
    for _round in range(2):  # the second round finds the decoder prefixes cached
        for rid, enc, dec, start, max_new in cases:
            sched.add_request(scoring(rid, enc, dec, start, max_new))
        out = drive(sched)
        for rid, enc, dec, start, max_new in cases:
            want = reference(hf_logits(t5_dir, enc, dec), dec, start)
            assert_close(out[rid]["input_logprobs"], want)
            assert out[rid]["ids"] == (hf_greedy(t5_dir, enc, max_new, dec) if max_new else [])
    assert all(out[f"{i}-2"]["cached"] == 4 for i in range(4)), "no prefix was reused"


def test_scores_agree_with_hf_in_one_batch_with_plain_requests(t5_dir):
    """Scored and ordinary requests share extend batches; the ordinary ones are unchanged."""
    tok = load_tokenizer(t5_dir)
    sched = make_scheduler(t5_dir)
    enc = tok(SOURCES[0]).input_ids
    dec = [0] + tok("Das Haus ist wunderbar.").input_ids
    sched.add_request(scoring("scored", enc, dec, 1, stream=True))
    sp = SamplingParams.from_dict({"temperature": 0, "max_new_tokens": 5, "ignore_eos": True})
    sched.add_request(TokenizedRequest(rid="plain", encoder_input_ids=enc,
                                       decoder_input_ids=[0], sampling_params=sp))
    out = drive(sched)
    assert_close(out["scored"]["input_logprobs"], reference(hf_logits(t5_dir, enc, dec), dec, 1))
    assert out["plain"]["ids"] == hf_greedy(t5_dir, enc, 5)
    assert out["plain"]["input_logprobs"] is None
    assert sched.stats()["max_batch_by_mode"]["extend"] == 2


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return str(write_llama_checkpoint(tmp_path_factory.mktemp("llama") / "m", seed=1,
                                      init_scale=10.0))


def test_llama_continuation_scores_match_hf(llama_dir, monkeypatch):
    from transformers import AutoModelForCausalLM

    from seq2serve.runtime.executor import model_runner

    monkeypatch.setattr(model_runner, "_SCORED_ROWS_AT_ONCE", 4)  # logits in several chunks

    tok = load_tokenizer(llama_dir)
    hf = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32).eval()
    prompt = tok("The capital of France is").input_ids
    sched = make_scheduler(llama_dir, page_size=4)
    cases = []
    for j, choice in enumerate([" Paris", " Berlin, of course", " a city " * 5]):
        ids = prompt + tok(choice, add_special_tokens=False).input_ids
        cases.append((str(j), ids, len(prompt) if j else 0))
    for _round in range(2):
        for rid, ids, start in cases:
            sched.add_request(scoring(rid, [], ids, start))
        out = drive(sched)
        for rid, ids, start in cases:
            with torch.no_grad():
                logits = hf(torch.tensor([ids])).logits[0]
            assert_close(out[rid]["input_logprobs"], reference(logits, ids, start))
            assert out[rid]["ids"] == []
    assert out["1"]["cached"] > 0, "the shared prompt's pages were not reused"


def test_bad_scoring_requests_are_refused(t5_dir):
    from seq2serve.runtime.frontend.generate_request import GenerateReqInput

    sched = make_scheduler(t5_dir)
    with pytest.raises(ValueError, match="logprob_start_len 5 needs return_logprob"):
        sched.add_request(scoring("x", [5, 1], [0, 7, 1], 5))
    with pytest.raises(ValueError, match="logprob_start_len needs return_logprob"):
        GenerateReqInput(text="x", logprob_start_len=1).normalize()
    with pytest.raises(ValueError, match="logprob_start_len must be an integer"):
        GenerateReqInput(text="x", return_logprob=True, logprob_start_len=-2).normalize()
    with pytest.raises(ValueError, match="num_beams > 1 needs max_new_tokens >= 1"):
        SamplingParams.from_dict({"num_beams": 2, "max_new_tokens": 0})
    sched.check_integrity()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_scores_from_graph_and_eager_prefills_match_hf_on_cuda(t5_dir, llama_dir):
    """On CUDA (Triton, CUDA graphs): a short scored extend replays the decode graphs (every
    row's logits), a long one runs eagerly; both are HF's float32 log-probs."""
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(t5_dir)
    sched = make_scheduler(t5_dir, device="cuda", dtype="float32")
    enc = tok(SOURCES[1]).input_ids
    for label in ["positive", "a b c d e f g h i j k l m n o p q r s t u v w x y z " * 2]:
        dec = [0] + tok(label).input_ids
        sched.add_request(scoring("t5", enc, dec, 1))
        got = drive(sched)["t5"]["input_logprobs"]
        want = reference(hf_logits(t5_dir, enc, dec), dec, 1)
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=2e-3, rtol=0)
    tok = load_tokenizer(llama_dir)
    hf = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32).eval()
    sched = make_scheduler(llama_dir, device="cuda", dtype="float32")
    for text in ["Hello there", "The quick brown fox jumps over the lazy dog " * 4]:
        ids = tok(text).input_ids
        sched.add_request(scoring("llama", [], ids, 2))
        got = drive(sched)["llama"]["input_logprobs"]
        with torch.no_grad():
            want = reference(hf(torch.tensor([ids])).logits[0], ids, 2)
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=2e-3, rtol=0)
