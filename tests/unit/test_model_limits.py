"""ModelLimits: the one check of what a request may be, shared by the TokenizerManager (a 400
for the caller) and the scheduler (which refuses what it could never run)."""

from __future__ import annotations

import pytest

from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.messages.model_limits import ModelLimits
from seq2serve.runtime.scheduler.scheduler import Scheduler
from seq2serve.runtime.tools.demo_checkpoint import default_demo_path
from seq2serve.tests.fake_executor import FakeExecutor
from seq2serve.tests.helpers import request

T5 = ModelLimits(vocab_size=100, input_vocab_size=100, is_encoder_decoder=True,
                 context_length=64, max_encoder_len=32, kv_capacity_tokens=48,
                 cross_capacity_tokens=1000)
VISION = ModelLimits(vocab_size=100, input_vocab_size=101, is_encoder_decoder=False,
                     context_length=64, max_encoder_len=20, kv_capacity_tokens=1000,
                     cross_capacity_tokens=16)


@pytest.mark.parametrize("limits,enc,dec,new,images,message", [
    (T5, [], [0], 4, 0, "the encoder input is empty"),
    (T5, [5], [], 4, 0, "the decoder input is empty"),
    (T5, [5, 100], [0], 4, 0, "input_ids has token id 100 outside [0, 100)"),
    (T5, [5], [0, -1], 4, 0, "decoder_input_ids has token id -1 outside [0, 100)"),
    (T5, list(range(33)), [0], 4, 0, "the input is 33 tokens, longer than the limit of 32"),
    # the smaller of the context (64) and the KV pool (48) decides
    (T5, [5], [0], 48, 0, "the decoder prefix (1 tokens) plus max_new_tokens (48) is 49, "
                          "over the limit of 48 (context length / KV pool)"),
    (VISION, [], [1, 100], 4, 0, None),  # <|image|> is in the prompt's vocabulary
    (VISION, [], [1, 101], 4, 0, "input_ids has token id 101 outside [0, 101)"),
    # the smaller of max_encoder_len (20) and the cross pool (16) decides
    (VISION, [], [1, 100], 4, 17, "the images need 17 cross-attention tokens, over the limit "
                                  "of 16"),
    # an encoder-decoder model's own inputs (Whisper's audio: 1,500 tokens a window) are its
    # encoder input: none of text is needed
    (T5, [], [0], 4, 32, None),
    (T5, [], [0], 4, 33, "the encoder inputs (audio) need 33 cross-attention tokens, over the "
                         "limit of 32"),
])
def test_each_rule_names_its_limit(limits, enc, dec, new, images, message):
    if message is None:
        limits.check(enc, dec, new, images)
        return
    with pytest.raises(ValueError) as e:
        limits.check(enc, dec, new, images)
    assert message in str(e.value)


def test_the_scheduler_refuses_with_the_same_rule_and_stays_clean():
    config = ModelConfig.from_path(str(default_demo_path()))
    args = ServerArgs(model_path=config.model_path, device="cpu", page_size=16)
    sched = Scheduler(args, config, None, FakeExecutor(args, config, kv_tokens=64,
                                                        context_len=512, max_encoder_len=8))
    assert sched.limits.kv_capacity_tokens == 64 and sched.limits.max_encoder_len == 8
    cases = {"long-source": (list(range(5, 14)), 4), "long-output": ([5], 64),
             "bad-id": ([5, 10**6], 4), "empty": ([], 4)}
    for rid, (enc, new) in cases.items():
        with pytest.raises(ValueError) as e:
            sched.add_request(request(rid, enc, max_new_tokens=new))
        with pytest.raises(ValueError) as same:
            sched.limits.check(enc, [0], new)
        assert str(e.value) == str(same.value), rid
    assert not sched.has_work
    sched.check_integrity()
