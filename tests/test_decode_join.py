"""A request admitted while others decode joins the running decode batch as one more row: its
start token at position 0 is computed by the next decode step, not by a forward of its own, and
the step in flight is not drained for it (with the overlap schedule every launch but the first
finds one step still unread). It generates what it generates alone, and what HF generates."""

from __future__ import annotations

import pytest

from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.tests.helpers import SOURCES, hf_greedy, make_scheduler, request, run_to_completion

A_TOKENS, B_TOKENS, B_ARRIVES = 10, 5, 3  # B arrives before step 3 and ends before A


def _watch(sched) -> list[dict]:
    """Every model forward, in order: its mode, rows, positions, input ids, and how many
    earlier launches the host had not read yet when it was launched."""
    runner, launch = sched.worker.model_runner, sched.worker.launch
    launches: list[dict] = []
    unread = [0]
    forward = runner.forward

    def counted_forward(wb):
        launches[-1]["model_forwards"] += 1
        return forward(wb)

    def watched_launch(wb):
        x = wb.inputs
        launches.append({"mode": wb.forward_mode.value, "rows": wb.batch_size,
                         "positions": x.positions.tolist(), "input_ids": x.input_ids.tolist(),
                         "device_ids": 0 if wb.input_ids_device is None
                         else wb.input_ids_device.numel(),
                         "unread": unread[0], "model_forwards": 0})
        out = launch(wb)
        unread[0] += 1
        wait = out.wait

        def counted_wait():
            unread[0] -= 1
            return wait()

        out.wait = counted_wait
        return out

    runner.forward = counted_forward
    sched.worker.launch = watched_launch
    return launches


def _alone(t5_dir: str, rid: str, source: list[int], n: int) -> list[int]:
    sched = make_scheduler(t5_dir)
    sched.add_request(request(rid, source, max_new_tokens=n, ignore_eos=True))
    return run_to_completion(sched)[rid]


@pytest.mark.parametrize("overlap", [True, False])
def test_a_request_admitted_mid_decode_joins_the_running_batch(t5_dir, overlap):
    tok = load_tokenizer(t5_dir)
    src_a, src_b = tok(SOURCES[0]).input_ids, tok(SOURCES[1]).input_ids
    sched = make_scheduler(t5_dir, disable_overlap_schedule=not overlap)
    launches = _watch(sched)

    def arrive(step: int) -> bool:
        if step == 0:
            sched.add_request(request("a", src_a, max_new_tokens=A_TOKENS, ignore_eos=True))
        if step == B_ARRIVES:
            sched.add_request(request("b", src_b, max_new_tokens=B_TOKENS, ignore_eos=True))
        return step < B_ARRIVES

    out = run_to_completion(sched, on_step=arrive)  # check_integrity() after every step

    # one decode forward per token of A, the longer request: B added no forward of its own
    assert [x["mode"] for x in launches] == ["decode"] * A_TOKENS
    assert all(x["model_forwards"] == 1 for x in launches)
    assert [x["rows"] for x in launches] == [1] * B_ARRIVES + [2] * B_TOKENS + [1] * (
        A_TOKENS - B_ARRIVES - B_TOKENS)
    # B's first row: its start token at position 0, beside A's next position
    joined = launches[B_ARRIVES]
    assert joined["positions"] == [B_ARRIVES, 0] and joined["input_ids"][1] == 0
    if overlap:  # A's input comes from the step in flight, on the device; B's from the host
        assert joined["device_ids"] == 1
        # nothing drained: every launch but the first found the step before still unread
        assert [x["unread"] for x in launches] == [0] + [1] * (A_TOKENS - 1)
    else:
        assert all(x["unread"] == 0 and x["device_ids"] == 0 for x in launches)
    assert sched.stats()["encoder_forwards"] == 2
    assert out["a"] == _alone(t5_dir, "a", src_a, A_TOKENS)
    assert out["b"] == _alone(t5_dir, "b", src_b, B_TOKENS) == hf_greedy(t5_dir, src_b, B_TOKENS)


def test_a_longer_decoder_prompt_extends_without_draining_the_decode(t5_dir):
    """A forced decoder prefix still runs as an EXTEND, launched before the decode step in
    flight is read; the decode after it takes the extend's token from the device."""
    tok = load_tokenizer(t5_dir)
    src_a, src_b = tok(SOURCES[0]).input_ids, tok(SOURCES[2]).input_ids
    prefix = [0, 644, 19]
    sched = make_scheduler(t5_dir)
    launches = _watch(sched)

    def arrive(step: int) -> bool:
        if step == 0:
            sched.add_request(request("a", src_a, max_new_tokens=8, ignore_eos=True))
        if step == 2:
            sched.add_request(request("b", src_b, prefix, max_new_tokens=4, ignore_eos=True))
        return step < 2

    out = run_to_completion(sched, on_step=arrive)
    assert [x["mode"] for x in launches] == ["decode"] * 2 + ["extend"] + ["decode"] * 6
    assert [x["unread"] for x in launches] == [0] + [1] * 8
    assert launches[3]["rows"] == 2 and launches[3]["device_ids"] == 1  # b's, from the extend
    assert out["a"] == _alone(t5_dir, "a", src_a, 8)
    assert out["b"] == hf_greedy(t5_dir, src_b, 4, decoder_input_ids=prefix)
