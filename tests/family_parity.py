"""The parity checks a new encoder-decoder family's test runs against HF in float32 on the
CPU, through the engine: greedy and beam search tokens (and beam scores), and embeddings
(HF's encoder output mean-pooled over every token, EOS included, L2-normalised)."""

from __future__ import annotations

import pytest
import torch

from seq2serve import Seq2SeqEngine
from seq2serve.tests.helpers import hf_model


def hf_generate(path: str, ids: list[int], max_new: int, eos: int, skip: int = 1,
                **gen) -> tuple[list[int], float | None]:
    """HF's tokens after the decoder start (and after a forced BOS: `skip` 2), cut after the
    first EOS (a beam's sequence is padded after it), and the beam score."""
    with torch.no_grad():
        out = hf_model(path).generate(torch.tensor([ids]), max_new_tokens=max_new,
                                      do_sample=False, output_scores=True,
                                      return_dict_in_generate=True, **gen)
    seq = out.sequences[0, skip:].tolist()
    if eos in seq:
        seq = seq[: seq.index(eos) + 1]
    return seq, (out.sequences_scores[0].item() if gen.get("num_beams", 1) > 1 else None)


def cpu_engine(path: str, **args) -> Seq2SeqEngine:
    return Seq2SeqEngine(model_path=path, device="cpu", dtype="float32", **args)


def check_generate(engine: Seq2SeqEngine, path: str, sources: list[list[int]], max_new: int,
                   eos: int, cases: list[dict], skip: int = 1) -> set[int]:
    """Every case (sampling parameters HF's generate takes too) gives HF's tokens for every
    source, and beams HF's scores; returns the outputs' lengths. `skip` as hf_generate's: 2
    where the checkpoint forces a BOS (one of HF's new tokens, not of ours)."""
    lengths = set()
    for case in cases:
        got = engine.generate(input_ids=sources, sampling_params={
            "max_new_tokens": max_new, "temperature": 0, **case})
        for ids, res in zip(sources, got):
            tokens, score = hf_generate(path, ids, max_new + skip - 1, eos, skip, **case)
            assert res["output_ids"] == tokens, (case, ids)
            if score is not None:
                assert res["meta_info"]["beam_score"] == pytest.approx(score, abs=1e-4)
            lengths.add(len(tokens))
    return lengths


@torch.no_grad()
def check_embeddings(engine: Seq2SeqEngine, path: str, sources: list[list[int]]) -> None:
    """`Seq2SeqEngine.embed` (what /v1/embeddings returns) equals HF's pooled encoder output."""
    got = engine.embed(input_ids=sources)
    for ids, vector in zip(sources, got):
        hidden = hf_model(path).get_encoder()(input_ids=torch.tensor([ids])).last_hidden_state
        want = torch.nn.functional.normalize(hidden[0].mean(0), dim=-1)
        torch.testing.assert_close(torch.tensor(vector), want, atol=1e-5, rtol=0)
