"""One step pipeline for admission and decode, through the fake executor: admitted one-token
decoder prompts become rows of the next decode step, longer ones an EXTEND launched before the
step in flight is read, and nothing is drained for either; every request still generates what
it generates alone."""

from __future__ import annotations

import pytest

from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.scheduler.scheduler import Scheduler
from seq2serve.runtime.tools.demo_checkpoint import default_demo_path
from seq2serve.tests.fake_executor import FakeExecutor, alone
from seq2serve.tests.helpers import request

CONFIG = ModelConfig.from_path(str(default_demo_path()))  # config.json only: no weights load
VOCAB = CONFIG.vocab_size


def _scheduler(overlap: bool) -> tuple[Scheduler, list[tuple[str, int]]]:
    """A scheduler and its launches: (mode, launches the host had not read at the time)."""
    a = ServerArgs(model_path=CONFIG.model_path, device="cpu",
                   disable_overlap_schedule=not overlap)
    fake = FakeExecutor(a, CONFIG)
    launches, unread, launch = [], [0], fake.launch

    def watched(wb):
        launches.append((wb.forward_mode.value, unread[0]))
        out = launch(wb)
        unread[0] += 1
        wait = out.wait
        out.wait = lambda: unread.__setitem__(0, unread[0] - 1) or wait()
        return out

    fake.launch = watched
    return Scheduler(a, CONFIG, None, fake), launches


def _scored(rid: str, decoder_ids: list[int]):
    tr = request(rid, [7, 8, 9, 1], decoder_ids, max_new_tokens=0)
    tr.return_logprob, tr.logprob_start_len = True, 0
    return tr


@pytest.mark.parametrize("overlap", [True, False])
def test_joins_and_extends_share_one_pipeline(overlap):
    sched, launches = _scheduler(overlap)
    one = [0]
    arrivals = {
        0: [request(f"j{k}", [100 + k, 1], one, max_new_tokens=6 + k, ignore_eos=True)
            for k in range(3)],
        2: [request("long", [50, 51, 1], [0, 5, 6], max_new_tokens=4, ignore_eos=True),
            request("rides", [52, 1], one, max_new_tokens=3, ignore_eos=True)],
        4: [request(f"late{k}", [60 + k, 1], one, max_new_tokens=5, ignore_eos=True,
                    min_new_tokens=2) for k in range(2)],
        5: [_scored("scored", [0, 9, 10])],
        7: [request("last", [70, 1], one, max_new_tokens=2, ignore_eos=True, temperature=0.7,
                    seed=11)],
    }
    prompts = {tr.rid: tr.decoder_input_ids for reqs in arrivals.values() for tr in reqs}
    wanted = {tr.rid: tr.sampling_params.max_new_tokens
              for reqs in arrivals.values() for tr in reqs}
    out: dict[str, list[int]] = {}
    finished = set()
    step = 0
    while sched.has_work or step <= max(arrivals):
        for tr in arrivals.get(step, []):
            sched.add_request(tr)
        for o in sched.step():
            out.setdefault(o.rid, []).extend(o.new_token_ids)
            if o.finished_reason is not None:
                finished.add(o.rid)
        sched.check_integrity()
        step += 1
    assert finished == set(prompts)
    for rid, ids in prompts.items():  # (the fake model ignores the sampling parameters)
        assert out.get(rid, []) == alone(ids, wanted[rid], VOCAB), rid
    # two admissions had a longer decoder prompt; the others added rows to decode steps
    assert [m for m, _ in launches].count("extend") == 2
    assert sched.forwards["extend"] == 2
    if overlap:  # every launch but the first found the step before it unread
        assert [u for _, u in launches] == [0] + [1] * (len(launches) - 1)
    else:
        assert all(u == 0 for _, u in launches)
