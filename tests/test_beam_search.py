"""Beam search against Hugging Face's `generate(num_beams=...)`: the same hypotheses, token for
token, and the same scores, with beam requests batched among greedy and sampled ones; memory
accounted for throughout, freed on abort, and retraction under memory pressure giving the
same results."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.runtime.messages.io_struct import TokenizedRequest
from seq2serve.tests.helpers import (
    SOURCES,
    T5_CONFIGS,
    hf_model,
    make_scheduler,
    make_t5,
    request,
    run_to_completion,
)

EOS = 1
STOPS = [19179, 2165]  # tokens these random weights produce often: hypotheses end early
MAX_NEW = 10

# (num_beams, num_return_sequences, length_penalty, early_stopping, no_repeat_ngram_size,
#  extra sampling params)
CASES = [
    (4, 1, 1.0, False, 0, {}),
    (3, 3, 0.6, True, 0, {}),
    (4, 2, 2.0, "never", 0, {}),
    (2, 2, -0.5, "never", 2, {"min_new_tokens": 3}),
    (5, 2, 1.0, False, 3, {"repetition_penalty": 1.3}),
]


@pytest.fixture(scope="module")
def beam_t5(tmp_path_factory) -> str:
    return str(make_t5(Path(tmp_path_factory.mktemp("beam")) / "t5",
                       **T5_CONFIGS["t5_relu_untied"]))


def hf_beams(path: str, ids: list[int], k: int, ret: int, lp: float, es, ngram: int,
             extra: dict) -> list[tuple[list[int], float]]:
    """HF's hypotheses (generated tokens up to and with the stop token) and scores."""
    model = hf_model(path)
    gen = dict(num_beams=k, num_return_sequences=ret, length_penalty=lp, early_stopping=es,
               no_repeat_ngram_size=ngram, max_new_tokens=MAX_NEW, do_sample=False,
               eos_token_id=[EOS, *STOPS], output_scores=True, return_dict_in_generate=True,
               use_cache=False)
    if "min_new_tokens" in extra:
        gen["min_new_tokens"] = extra["min_new_tokens"]
    if "repetition_penalty" in extra:
        gen["repetition_penalty"] = extra["repetition_penalty"]
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), **gen)
    results = []
    for seq, score in zip(out.sequences[:, 1:].tolist(), out.sequences_scores.tolist()):
        end = next((i for i, t in enumerate(seq) if t in (EOS, *STOPS)), len(seq) - 1)
        results.append((seq[:end + 1], score))
    return results


def beam_request(rid: str, ids: list[int], k: int, ret: int, lp: float, es, ngram: int,
                 extra: dict) -> TokenizedRequest:
    tr = request(rid, ids, num_beams=k, num_return_sequences=ret, length_penalty=lp,
                 early_stopping=es, no_repeat_ngram_size=ngram, max_new_tokens=MAX_NEW,
                 stop_token_ids=STOPS, **extra)
    tr.beam_rids = [rid] + [f"{rid}-{i}" for i in range(1, ret)] if ret > 1 else None
    return tr


def run(sched) -> dict[str, tuple[list[int], dict]]:
    results = {}
    while sched.has_work:
        for o in sched.step():
            assert o.finished_reason is not None, "beam requests send only final outputs"
            results[o.rid] = (o.new_token_ids, o.extra)
        sched.check_integrity()
    return results


def test_beams_match_hf_mixed_with_greedy_and_sampled_requests(beam_t5):
    tok = load_tokenizer(beam_t5)
    sources = [tok(s).input_ids for s in SOURCES[:4]]
    sched = make_scheduler(beam_t5, page_size=4)
    expected = {}
    for c, case in enumerate(CASES):
        for s, ids in enumerate(sources):
            rid = f"c{c}s{s}"
            sched.add_request(beam_request(rid, ids, *case))
            expected[rid] = hf_beams(beam_t5, ids, *case)
        sched.add_request(request(f"greedy{c}", sources[c % 4], max_new_tokens=MAX_NEW))
        sched.add_request(request(f"sampled{c}", sources[c % 4], max_new_tokens=MAX_NEW,
                                  temperature=0.8, seed=c))
    got = run(sched)
    lengths = set()
    for rid, hyps in expected.items():
        ret = len(hyps)
        rids = [rid] + [f"{rid}-{i}" for i in range(1, ret)]
        for i, (r, (tokens, score)) in enumerate(zip(rids, hyps)):
            out_tokens, extra = got[r]
            assert out_tokens == tokens, f"{r} (hypothesis {i})"
            assert extra["beam_score"] == pytest.approx(score, abs=1e-4), r
            lengths.add(len(tokens))
    assert len(lengths) >= 3, f"hypotheses should end at different lengths: {lengths}"
    # the greedy request in the same batches is unaffected
    for c in range(len(CASES)):
        alone = make_scheduler(beam_t5, page_size=4)
        alone.add_request(request("g", sources[c % 4], max_new_tokens=MAX_NEW))
        assert got[f"greedy{c}"][0] == run_to_completion(alone)["g"]


def run_counting_steps_ahead(sched) -> tuple[dict, int]:
    """Run to the end: rid -> (tokens, beam score), and how many beam steps were launched
    before the host had read the step before (the overlap schedule)."""
    ahead, got = 0, {}
    while sched.has_work:
        for o in sched.step():
            got[o.rid] = (o.new_token_ids, o.extra.get("beam_score"))
        ahead += sched.in_flight is not None and bool(sched.in_flight.batch.beam_groups)
        sched.check_integrity()
    return got, ahead


def test_beam_steps_run_a_step_ahead_of_the_host(beam_t5):
    """Past its first step a beam group's beams are chosen on the device, so the next step is
    launched before the host has read this one (the overlap schedule): the same hypotheses
    and scores as HF, and as the schedule without overlap, with a page size that makes the
    rows copy last pages and cross page boundaries."""
    tok = load_tokenizer(beam_t5)
    sources = [tok(s).input_ids for s in SOURCES[:3]]
    expected, results = {}, []
    for overlap in (True, False):
        sched = make_scheduler(beam_t5, page_size=3, disable_overlap_schedule=not overlap)
        for c, case in enumerate(CASES[:3]):  # no n-gram bans or penalties: overlappable
            for s, ids in enumerate(sources):
                sched.add_request(beam_request(f"c{c}s{s}", ids, *case))
                if overlap:
                    expected[f"c{c}s{s}"] = hf_beams(beam_t5, ids, *case)
            sched.add_request(request(f"sampled{c}", sources[c], max_new_tokens=MAX_NEW,
                                      temperature=0.8, seed=c))
        got, ahead = run_counting_steps_ahead(sched)
        assert (ahead > 0) == overlap, ahead
        results.append(got)
    # the same tokens; scores to float32 rounding: with overlap a group sits out the step
    # launched while its first is in flight, so the batches (and the CPU GEMMs' blocking, to
    # the last bit of a logit) differ between the two schedules
    assert results[0].keys() == results[1].keys()
    for rid, (tokens, score) in results[0].items():
        assert results[1][rid][0] == tokens, rid
        close = score if score is None else pytest.approx(score, rel=1e-6)  # (None: no beams)
        assert results[1][rid][1] == close, rid
    for rid, hyps in expected.items():
        for i, (tokens, score) in enumerate(hyps):
            r = rid if i == 0 else f"{rid}-{i}"
            assert results[0][r][0] == tokens, r
            assert results[0][r][1] == pytest.approx(score, abs=1e-4), r


@pytest.mark.parametrize("overlap", [True, False])
def test_beam_requests_arriving_mid_decode_join_the_decode_steps(beam_t5, overlap):
    """A beam request admitted while beam groups and a greedy request decode is a row of the
    next decode step (its prompt's token beside the others' next ones), not an EXTEND of its
    own during which every running request waits: no forward but decodes, every running group
    advancing at every step, and every result HF's, with a page size that makes the first
    step copy a partly filled page. With the overlap schedule every decode after the first is
    launched ahead of the step in flight: a group sits out the step launched while its first
    is in flight and joins the next with the rows the host made (their tokens and scores from
    the host, beside groups whose come from the device)."""
    tok = load_tokenizer(beam_t5)
    sources = [tok(s).input_ids for s in SOURCES[:4]]
    sched = make_scheduler(beam_t5, page_size=3, disable_overlap_schedule=not overlap)
    modes, launch = [], sched.worker.launch
    sched.worker.launch = lambda wb: modes.append(wb.forward_mode.value) or launch(wb)
    ahead, step_launch = [], sched._launch  # whether each launch ran ahead of the step in flight

    def counted(mode, reqs, prev=None, chunk=None):
        ahead.append(prev is not None)
        return step_launch(mode, reqs, prev, chunk)

    sched._launch = counted
    arrivals = {0: [0], 2: [1], 3: [2], 6: [3]}  # step -> sources arriving before it
    expected, got = {}, {}
    sched.add_request(request("greedy", sources[0], max_new_tokens=MAX_NEW, ignore_eos=True))
    step = 0
    while sched.has_work or step <= max(arrivals):
        for s in arrivals.get(step, []):
            case = CASES[s % 3]  # no n-gram bans or penalties: overlappable
            sched.add_request(beam_request(f"s{s}", sources[s], *case))
            expected[f"s{s}"] = hf_beams(beam_t5, sources[s], *case)
        for o in sched.step():
            got[o.rid] = (o.new_token_ids, o.extra.get("beam_score"))
        sched.check_integrity()
        step += 1
    assert set(modes) == {"decode"}, modes
    if overlap:  # a group's first step, and the step after it, run ahead like any other
        assert ahead == [False] + [True] * (len(ahead) - 1), ahead
    assert got["greedy"][0] == _greedy_alone(beam_t5, sources[0])
    for rid, hyps in expected.items():
        for i, (tokens, score) in enumerate(hyps):
            r = rid if i == 0 else f"{rid}-{i}"
            assert got[r][0] == tokens, r
            assert got[r][1] == pytest.approx(score, abs=1e-4), r


def _greedy_alone(path: str, ids: list[int]) -> list[int]:
    sched = make_scheduler(path, page_size=3)
    sched.add_request(request("alone", ids, max_new_tokens=MAX_NEW, ignore_eos=True))
    return run_to_completion(sched)["alone"]


def _strip(tokens: list[int], stops) -> list[int]:
    """A hypothesis as HF pads it, cut after its first stop token."""
    end = next((i for i, t in enumerate(tokens) if t in stops), len(tokens) - 1)
    return tokens[:end + 1]


def test_llama_beams_match_hf(tmp_path):
    """Decoder-only: the prompt is the decoder prefix (and counts for the n-gram bans and the
    repetition penalty); HF's length counts only the new tokens."""
    from transformers import AutoModelForCausalLM

    from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint

    path = str(write_llama_checkpoint(tmp_path / "llama", init_scale=10.0, seed=1,
                                      num_attention_heads=4, num_key_value_heads=2))
    tok = load_tokenizer(path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = [tok(p).input_ids for p in ("Hello world", "The capital of France is",
                                          "1 2 3 4 5 6 7 8")]
    with torch.no_grad():  # stop tokens the model produces: hypotheses end at various lengths
        greedy = [hf.generate(torch.tensor([p]), max_new_tokens=MAX_NEW, do_sample=False)
                  [0, len(p):].tolist() for p in prompts]
    stops = sorted({g[3] for g in greedy})[:2]
    eos = hf.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos)
    sched = make_scheduler(path, page_size=4)
    expected = {}
    for c, (k, ret, lp, es, ngram, extra) in enumerate(CASES[:4]):
        for s, ids in enumerate(prompts):
            rid = f"c{c}s{s}"
            tr = request(rid, [], ids, num_beams=k, num_return_sequences=ret, length_penalty=lp,
                         early_stopping=es, no_repeat_ngram_size=ngram, max_new_tokens=MAX_NEW,
                         stop_token_ids=stops, **extra)
            tr.beam_rids = [rid] + [f"{rid}-{i}" for i in range(1, ret)] if ret > 1 else None
            sched.add_request(tr)
            with torch.no_grad():
                out = hf.generate(torch.tensor([ids]), num_beams=k, num_return_sequences=ret,
                                  length_penalty=lp, early_stopping=es, do_sample=False,
                                  no_repeat_ngram_size=ngram, max_new_tokens=MAX_NEW,
                                  eos_token_id=eos + stops, output_scores=True,
                                  return_dict_in_generate=True, **extra)
            expected[rid] = [(_strip(seq, eos + stops), score) for seq, score in
                             zip(out.sequences[:, len(ids):].tolist(),
                                 out.sequences_scores.tolist())]
        sched.add_request(request(f"greedy{c}", [], prompts[0], max_new_tokens=MAX_NEW))
    got = run(sched)
    lengths = set()
    for rid, hyps in expected.items():
        rids = [rid] + [f"{rid}-{i}" for i in range(1, len(hyps))]
        for r, (tokens, score) in zip(rids, hyps):
            assert got[r][0] == tokens, r
            assert got[r][1]["beam_score"] == pytest.approx(score, abs=1e-4), r
            lengths.add(len(tokens))
    assert len(lengths) >= 2, lengths
    assert got["greedy0"][0] == greedy[0]


def test_mllama_beams_over_one_image_match_hf(tmp_path):
    """The beams of an image request all read the image's one copy of cross K/V."""
    from seq2serve import Seq2SeqEngine
    from seq2serve.runtime.tools.demo_checkpoint import write_mllama_checkpoint
    from seq2serve.tests.mllama_oracle import MllamaOracle, random_image

    path = str(write_mllama_checkpoint(tmp_path / "mllama", seed=3))
    oracle = MllamaOracle(path)
    tok = oracle.processor.tokenizer
    ids = [128256, tok.bos_token_id] + tok("Describe the picture",
                                           add_special_tokens=False).input_ids
    image = random_image(1, 40, 90)
    with Seq2SeqEngine(model_path=path, device="cpu", max_image_pixels=200_000) as engine:
        outs = engine.generate(input_ids=[ids, ids], image_data=[[image], [image]],
                               sampling_params=[{"num_beams": 3, "max_new_tokens": 6,
                                                 "ignore_eos": True},
                                                {"max_new_tokens": 6, "temperature": 0,
                                                 "ignore_eos": True}])
        engine.check_integrity()
    (tokens, score), = oracle.beams(ids, [image], 6, num_beams=3, eos_token_id=[])
    assert outs[0]["output_ids"] == tokens
    assert outs[0]["meta_info"]["beam_score"] == pytest.approx(score, abs=1e-4)
    assert outs[1]["output_ids"] == oracle.generate_ids(ids, [image], 6)


def test_abort_frees_a_beam_request_midway(beam_t5):
    tok = load_tokenizer(beam_t5)
    ids = tok(SOURCES[0]).input_ids
    sched = make_scheduler(beam_t5, page_size=4)
    sched.add_request(beam_request("a", ids, 4, 2, 1.0, False, 0, {}))
    sched.add_request(request("g", ids, max_new_tokens=MAX_NEW))
    for _ in range(3):
        sched.step()
        sched.check_integrity()
    assert sched.running_rows == 5  # four beams and the greedy request
    first = sched.abort_request("a-1")  # any of its result rids aborts it
    assert first.rid == "a" and first.finished_reason["type"] == "abort"
    sched.check_integrity()
    outs = run(sched)
    assert outs["a-1"][0] == [] and "g" in outs
    sched.flush_cache()
    assert sched.memory.token_to_kv.allocator.num_used == 0
    assert sched.memory.req_to_token.num_free == sched.memory.req_to_token.size


def test_a_group_in_an_aborted_groups_slot_starts_fresh(beam_t5):
    """The device rules' slot of a beam group aborted midway (early_stopping True, stop ids:
    its hypotheses and flags are set by then) is taken by the next group of its num_beams,
    which must start from a clean state: its results are HF's."""
    tok = load_tokenizer(beam_t5)
    a, b = (tok(s).input_ids for s in SOURCES[:2])
    sched = make_scheduler(beam_t5, page_size=4)
    sched.add_request(beam_request("a", a, 3, 1, 1.0, True, 0, {}))
    for _ in range(6):
        sched.step()
    (group,) = {r.beam for r in sched.running}
    slot = group.slot
    assert slot is not None
    sched.abort_request("a")
    sched.add_request(beam_request("b", b, 3, 2, 0.5, True, 0, {}))
    sched.step()
    (group,) = {r.beam for r in sched.running}
    assert group.slot == slot  # (the lowest free one: the aborted group's)
    outs = run(sched)
    for rid, (tokens, score) in zip(["b", "b-1"], hf_beams(beam_t5, b, 3, 2, 0.5, True, 0, {})):
        assert outs[rid][0] == tokens, rid
        assert outs[rid][1]["beam_score"] == pytest.approx(score, abs=1e-4), rid


def test_memory_pressure_retracts_beams_and_gives_the_same_results(beam_t5):
    tok = load_tokenizer(beam_t5)
    sources = [tok(s).input_ids for s in SOURCES[:6]]
    reqs = [beam_request(f"b{i}", ids, 4, 2, 1.0, "never", 0, {}) for i, ids in
            enumerate(sources)]
    roomy = make_scheduler(beam_t5, page_size=4)
    tight = make_scheduler(beam_t5, page_size=4, max_total_tokens=112)
    for sched in (roomy, tight):
        for tr in reqs:
            sched.add_request(tr)
    expected, got = run(roomy), run(tight)
    assert tight.num_retractions > 0
    assert {r: v[0] for r, v in got.items()} == {r: v[0] for r, v in expected.items()}


def test_beams_share_their_prefix_pages(beam_t5):
    """A beam-4 request's decoder KV is far below four greedy requests' (only diverging
    pages are held twice), reported as meta kv_bytes."""
    tok = load_tokenizer(beam_t5)
    ids = tok(SOURCES[1]).input_ids
    sched = make_scheduler(beam_t5, page_size=4)
    sched.add_request(beam_request("b", ids, 4, 1, 1.0, "never", 0, {}))
    sched.add_request(request("g", ids, max_new_tokens=MAX_NEW, ignore_eos=True))
    got = run(sched)
    beam, greedy = got["b"][1]["kv_bytes"], got["g"][1]["kv_bytes"]
    assert greedy < beam < 4 * greedy, (beam, greedy)


def test_beam_requests_refuse_what_they_cannot_honour(beam_t5):
    sched = make_scheduler(beam_t5, page_size=4)
    ids = [5, 6, 1]
    with pytest.raises(ValueError, match="stream cannot be combined with num_beams"):
        tr = beam_request("s", ids, 2, 1, 1.0, False, 0, {})
        tr.stream = True
        sched.add_request(tr)
    with pytest.raises(ValueError, match="num_return_sequences"):
        sched.add_request(beam_request("r", ids, 2, 3, 1.0, False, 0, {}))
    with pytest.raises(ValueError, match="KV tokens"):
        sched.add_request(request("m", ids, num_beams=32, max_new_tokens=500))
    assert not sched.has_work
