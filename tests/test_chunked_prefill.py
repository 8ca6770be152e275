"""Chunked prefill (`--chunked-prefill-size`) on a tiny Llama, CPU float32: a prompt longer
than a chunk is prefilled over several steps, a decode step of the running requests between
two chunks; every request generates what it generates unchunked and what HF generates, no
step computes more prompt tokens than a chunk, and the pools account for every slot at every
step, an abort mid-prefill included."""

from __future__ import annotations

import pytest
import torch

from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint
from seq2serve.tests.helpers import make_scheduler, request

CHUNK = 16
NEW = 10
LONG = [128000] + [(7919 * i) % 5000 + 300 for i in range(1, 90)]  # 90 tokens: 6 chunks
PROMPTS = [LONG, LONG[:41], LONG[:17], [128000, 9906, 1917]]  # 3, 2, 2 and 1 chunk(s)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return str(write_llama_checkpoint(tmp_path_factory.mktemp("llama") / "m", init_scale=10.0,
                                      num_key_value_heads=2, seed=1))


def _watch(sched) -> list[tuple[str, int, int]]:
    """Every launch: (mode, rows, new tokens)."""
    launches, launch = [], sched.worker.launch

    def watched(wb):
        launches.append((wb.forward_mode.value, wb.batch_size, sum(wb.inputs.extend_lens)))
        return launch(wb)

    sched.worker.launch = watched
    return launches


def _run(sched, arrivals: dict[int, list], on_step=None) -> dict[str, list]:
    """Step until idle (requests added before their step), checking the pools after every
    step; rid -> its outputs."""
    out: dict[str, list] = {}
    step = 0
    while sched.has_work or step <= max(arrivals, default=0):
        for tr in arrivals.get(step, []):
            sched.add_request(tr)
        for o in sched.step():
            out.setdefault(o.rid, []).append(o)
        sched.check_integrity()
        if on_step is not None:
            on_step(step)
        step += 1
    return out


def _tokens(outs) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


def _logprobs(outs) -> list[float]:
    return [x for o in outs for x in (o.new_logprobs or [])]


@pytest.mark.parametrize("overlap", [True, False])
def test_chunked_outputs_equal_unchunked_and_hf(llama_dir, overlap):
    from transformers import AutoModelForCausalLM

    results = {}
    for size in (None, CHUNK):
        sched = make_scheduler(llama_dir, chunked_prefill_size=size,
                               disable_overlap_schedule=not overlap)
        launches = _watch(sched)
        reqs = []
        for i, ids in enumerate(PROMPTS):
            tr = request(f"g{i}", [], ids, max_new_tokens=NEW, ignore_eos=True)
            lp = request(f"l{i}", [], ids, max_new_tokens=NEW, ignore_eos=True)
            lp.return_logprob = True
            sampled = request(f"t{i}", [], ids, max_new_tokens=NEW, ignore_eos=True,
                              temperature=0.8, top_p=0.9, seed=100 + i,
                              repetition_penalty=1.3)  # (reads every token: no overlap)
            reqs += [tr, lp, sampled]
        results[size] = _run(sched, {0: reqs})
        extends = [n for mode, _, n in launches if mode == "extend"]
        if size is None:
            assert max(extends) > 2 * sum(map(len, PROMPTS[:2]))  # one forward of them all
        else:
            # (later admissions may hit the radix cache: earlier requests finished meanwhile)
            assert max(extends) <= CHUNK and extends.count(CHUNK) >= 3
    hf = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32).eval()
    for i, ids in enumerate(PROMPTS):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False,
                              num_beams=1)[0, len(ids):].tolist()
        assert len(set(ref)) > NEW // 4, f"prompt {i} degenerate: {ref}"
        for rid in (f"g{i}", f"l{i}"):
            assert _tokens(results[CHUNK][rid]) == _tokens(results[None][rid]) == ref, rid
        # seeded sampling with a penalty: its dropped chunk samples change nothing
        assert _tokens(results[CHUNK][f"t{i}"]) == _tokens(results[None][f"t{i}"])
        assert _tokens(results[CHUNK][f"t{i}"]) != ref, "sampling made no difference"
        torch.testing.assert_close(_logprobs(results[CHUNK][f"l{i}"]),
                                   _logprobs(results[None][f"l{i}"]), atol=1e-4, rtol=0)
        assert len(_logprobs(results[CHUNK][f"l{i}"])) == NEW


@pytest.mark.parametrize("overlap", [True, False])
def test_running_requests_decode_between_chunks(llama_dir, overlap):
    out, launches = {}, {}
    for size in (None, CHUNK):
        sched = make_scheduler(llama_dir, chunked_prefill_size=size,
                               disable_overlap_schedule=not overlap)
        launches[size] = _watch(sched)
        arrivals = {0: [request(f"s{k}", [], [128000, 9906 + k, 1917], max_new_tokens=20,
                                ignore_eos=True) for k in range(3)],
                    3: [request("long", [], LONG, max_new_tokens=4, ignore_eos=True)]}
        out[size] = {rid: _tokens(o) for rid, o in _run(sched, arrivals).items()}
    # the long prompt: 6 chunks of at most CHUNK tokens, each followed by a decode step of
    # the three running requests (the last chunk's row joins them), where unchunked it was
    # one EXTEND of 90 tokens
    seen = launches[CHUNK]
    assert ("extend", 1, 90) in launches[None]
    assert seen[0] == ("extend", 3, 9)  # the short prompts
    chunks = [i for i, (mode, _, _) in enumerate(seen) if mode == "extend" and i > 0]
    assert [seen[i][2] for i in chunks] == [16, 16, 16, 16, 16, 10]
    assert all(n <= CHUNK for _, _, n in seen)
    for i in chunks[:-1]:
        assert seen[i + 1] == ("decode", 3, 3), seen[i - 1: i + 3]
    assert seen[chunks[-1] + 1] == ("decode", 4, 4)
    # and every request generated what it generates unchunked
    assert out[CHUNK] == out[None] and len(out[CHUNK]) == 4


@pytest.mark.parametrize("overlap", [True, False])
def test_input_logprobs_across_chunks(llama_dir, overlap):
    """A prompt scored from `logprob_start_len` on: each chunk scores its tokens and the next
    chunk's first (by its last logits); the whole equals the unchunked scores and HF's."""
    from transformers import AutoModelForCausalLM

    prompt = LONG[:40]
    starts = {"s0": 0, "s5": 5, "s16": 16, "s17": 17, "s39": 39}
    results, extends = {}, {}
    for size in (None, CHUNK):
        sched = make_scheduler(llama_dir, chunked_prefill_size=size, disable_radix_cache=True,
                               disable_overlap_schedule=not overlap)
        launches = _watch(sched)
        reqs = []
        for rid, k in starts.items():
            tr = request(rid, [], prompt, max_new_tokens=0 if k == 39 else 3, ignore_eos=True)
            tr.return_logprob, tr.logprob_start_len = True, k
            reqs.append(tr)
        results[size] = {rid: outs[0] for rid, outs in _run(sched, {0: reqs}).items()}
        extends[size] = [n for mode, _, n in launches if mode == "extend"]
    assert max(extends[CHUNK]) <= CHUNK and max(extends[None]) == 5 * 40
    hf = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logp = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), dim=-1)
    ref = [logp[p - 1, prompt[p]].item() for p in range(1, len(prompt))]
    for rid, k in starts.items():
        got, whole = results[CHUNK][rid].input_logprobs, results[None][rid].input_logprobs
        assert len(got) == len(prompt) - k and (got[0] is None) == (k == 0), rid
        drop = 1 if k == 0 else 0
        torch.testing.assert_close(got[drop:], whole[drop:], atol=1e-5, rtol=0)
        torch.testing.assert_close(got[drop:], ref[max(k, 1) - 1:], atol=1e-4, rtol=0)


@pytest.mark.parametrize("overlap", [True, False])
def test_abort_mid_prefill_frees_everything(llama_dir, overlap):
    sched = make_scheduler(llama_dir, chunked_prefill_size=CHUNK,
                           disable_overlap_schedule=not overlap)
    launches = _watch(sched)
    sched.add_request(request("long", [], LONG, max_new_tokens=4, ignore_eos=True))
    for _ in range(2):
        assert sched.step() == []
        sched.check_integrity()
    assert sched.chunked is not None and 0 < sched.chunked.kv_len < len(LONG)
    aborted = sched.abort_request("long")
    assert aborted.finished_reason["type"] == "abort" and aborted.new_token_ids == []
    while sched.has_work:  # (with overlap: the chunk in flight is read, and dropped)
        assert sched.step() == []
        sched.check_integrity()
    assert [n for mode, _, n in launches] == [CHUNK, CHUNK]
    mem = sched.memory
    assert mem.req_to_token.num_free == mem.req_to_token.size
    assert mem.token_to_kv.allocator.num_used == 0  # a partial prompt is never cached


def test_chunks_on_the_triton_kernels(llama_dir):
    """The Triton extend kernel reads a chunk's queries as the last positions of its row's
    `seq_lens` (the chunk's end, not the prompt's): on the CPU, in Triton's interpreter."""
    out = {}
    for backend, size in (("torch_native", None), ("triton", CHUNK)):
        sched = make_scheduler(llama_dir, chunked_prefill_size=size, attention_backend=backend)
        tr = request("long", [], LONG[:40], max_new_tokens=3, ignore_eos=True)
        tr.return_logprob = True
        out[backend] = _run(sched, {0: [tr]})["long"]
    assert _tokens(out["triton"]) == _tokens(out["torch_native"])
    torch.testing.assert_close(_logprobs(out["triton"]), _logprobs(out["torch_native"]),
                               atol=1e-4, rtol=0)


@pytest.mark.parametrize("overlap", [True, False])
def test_a_last_chunk_of_one_token_is_a_decode_row(llama_dir, overlap):
    """33 tokens: two chunks, then the last prompt token as a fresh row of a decode step (its
    input the prompt's token, not the chunk's unused sample, though that chunk is in flight)."""
    out, launches = {}, {}
    for size in (None, CHUNK):
        sched = make_scheduler(llama_dir, chunked_prefill_size=size,
                               disable_overlap_schedule=not overlap)
        launches[size] = _watch(sched)
        tr = request("r", [], LONG[:33], max_new_tokens=4, ignore_eos=True)
        out[size] = _tokens(_run(sched, {0: [tr]})["r"])
    assert launches[CHUNK] == [("extend", 1, 16)] * 2 + [("decode", 1, 1)] * 4
    assert out[CHUNK] == out[None]


@pytest.mark.parametrize("size", [None, CHUNK])
def test_beam_rows_decode_while_a_long_prompt_is_prefilled(llama_dir, size):
    """A beam search running (overlapped) when a long prompt comes: its rows are never laid
    out as continuing a step they were not in (the EXTEND or chunk in flight); it finds what
    it finds alone."""
    out = {}
    for long in (False, True):
        sched = make_scheduler(llama_dir, chunked_prefill_size=size)
        arrivals = {0: [request("beam", [], [128000, 9906, 1917], max_new_tokens=12,
                                num_beams=2)]}
        if long:
            arrivals[3] = [request("long", [], LONG, max_new_tokens=4, ignore_eos=True)]
        out[long] = _tokens(_run(sched, arrivals)["beam"])
    assert out[True] == out[False]


def test_memory_pressure_retracts_the_chunked_prompt_first(llama_dir):
    """A pool too small for the running requests' growth and the long prompt together: the
    prompt being chunked (no token yet) is retracted, starts over later, and every request
    still generates what it generates with room to spare."""
    out, victims = {}, []
    for tokens in (4096, 224):  # 224: 14 pages of 16
        # chunks of 4: the prompt's 23 chunks take longer than the running requests take to
        # need more pages than the pool has left
        sched = make_scheduler(llama_dir, chunked_prefill_size=4, max_total_tokens=tokens)
        retract = sched._retract

        def watched(victim, sched=sched, retract=retract):
            victims.append((tokens, victim.rid, victim is sched.chunked))
            retract(victim)

        sched._retract = watched
        arrivals = {0: [request(f"s{k}", [], LONG[50 + k:63 + k], max_new_tokens=40,
                                ignore_eos=True) for k in range(3)],
                    2: [request("long", [], LONG, max_new_tokens=4, ignore_eos=True)]}
        out[tokens] = {rid: _tokens(o) for rid, o in _run(sched, arrivals).items()}
    assert victims and victims[0] == (224, "long", True), victims
    assert out[224] == out[4096] and len(out[224]) == 4
