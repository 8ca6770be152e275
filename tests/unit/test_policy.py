"""FairPolicy alone: the admission order across callers and the retraction choice."""

from __future__ import annotations

from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.scheduler.policy import FairPolicy
from seq2serve.runtime.scheduler.req import Req


def _req(rid: str, outputs: int = 0, arrival: float = 0.0) -> Req:
    r = Req(rid=rid, encoder_input_ids=[5], decoder_input_ids=[0],
            sampling_params=SamplingParams.from_dict({"max_new_tokens": 4}))
    r.output_ids, r.arrival_time = [7] * outputs, arrival
    return r


def test_a_late_caller_is_not_queued_behind_a_big_call():
    p = FairPolicy()
    for i in range(4):
        p.push(_req(f"big{i}"), "big")
    p.push(_req("small"), "small")
    order = [p.admit().rid for _ in range(5)]
    assert order == ["big0", "small", "big1", "big2", "big3"]
    assert not p.group_tags  # nothing waits: no history kept


def test_a_retracted_request_comes_back_first_and_refusals_do_not_count():
    p = FairPolicy()
    p.push(_req("a"), "a")
    p.push(_req("b"), "b")
    p.push_front(_req("back"))
    assert p.peek().rid == "back" and p.drop().rid == "back"
    assert [r.rid for r in p] == ["a", "b"] and len(p) == 2


def test_the_victim_has_made_the_least_progress_and_came_last():
    running = [_req("old", 3, 1.0), _req("young", 1, 2.0), _req("younger", 1, 3.0)]
    assert FairPolicy.victim(running).rid == "younger"


def test_the_batches_of_one_call_are_one_caller():
    """`split_rows` cuts a call over max_batch_inputs into batches of one fairness group: the
    call's prompts are admitted in their order, and a later caller still goes second."""
    from seq2serve.runtime.frontend.generate_request import GenerateReqInput, split_rows

    obj = GenerateReqInput(input_ids=[[5, 1]] * 10, sampling_params={"num_beams": 2})
    chunks = split_rows(obj, 6)  # 3 prompts (6 rows) a batch
    assert [len(c.input_ids) for c in chunks] == [3, 3, 3, 1]
    assert len({c.group for c in chunks}) == 1 and chunks[0].group is not None
    given = GenerateReqInput(input_ids=[[5, 1]] * 4, group="mine")
    assert {c.group for c in split_rows(given, 2)} == {"mine"}
    p = FairPolicy()
    for k, c in enumerate(chunks[:2]):  # two batches arrive, then another caller's prompt
        for i in range(3):
            p.push(_req(f"{k}.{i}"), c.group)
    p.push(_req("other"), "other")
    order = [p.admit().rid for _ in range(7)]
    assert order == ["0.0", "other", "0.1", "0.2", "1.0", "1.1", "1.2"]
