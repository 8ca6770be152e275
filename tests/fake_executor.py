"""A stand-in for the ModelWorker that needs no model: real (tiny) pools, and a next token that
is a fixed function of the previous token and its position, so that what a request generates
does not depend on what it was batched with, retracted or overlapped with. Scheduler tests
drive it in milliseconds and compare with `alone`, the same rule applied to one request."""

from __future__ import annotations

import torch

from seq2serve.cross_attention.cross_kv_pool import CrossKVPool
from seq2serve.runtime.attention.forward_batch import ForwardMode
from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.executor.sampler import StepOutput
from seq2serve.runtime.executor.worker_batch import DecoderBatch, EncodeBatch
from seq2serve.runtime.memory.req_to_token_pool import ReqToTokenPool
from seq2serve.runtime.memory.token_to_kv_pool import TokenToKVPool


def next_token(prev: int, pos: int, vocab: int) -> int:
    """The fake model: token after `prev` at decoder position `pos` (never 0 or 1, the pad
    and EOS of T5 vocabularies, unless `vocab` is tiny)."""
    return 2 + (prev * 31 + pos * 7 + 3) % (vocab - 2)


def alone(decoder_ids: list[int], max_new_tokens: int, vocab: int) -> list[int]:
    """What one request generates on its own under `next_token` (EOS never comes)."""
    ids = list(decoder_ids)
    for _ in range(max_new_tokens):
        ids.append(next_token(ids[-1], len(ids) - 1, vocab))
    return ids[len(decoder_ids):]


class FakeExecutor:
    def __init__(self, args: ServerArgs, model_config: ModelConfig, *, kv_tokens: int = 4096,
                 cross_tokens: int = 4096, context_len: int = 512, max_encoder_len: int = 512):
        ps = args.page_size
        self.device = "cpu"
        self.vocab = model_config.vocab_size
        self.req_to_token_pool = ReqToTokenPool(args.max_running_requests + 1, context_len,
                                                max_encoder_len, "cpu")
        # one layer, one head of size 1: the pools' bookkeeping is real, their data is not used
        self.token_to_kv_pool = TokenToKVPool(kv_tokens // ps, ps, 1, 1, 1, torch.float32, "cpu")
        self.cross_kv_pool = (CrossKVPool(cross_tokens // ps, ps, 1, 1, 1, torch.float32, "cpu")
                              if model_config.is_encoder_decoder else None)
        self.forwards: dict[str, int] = {}
        self.rows_seen = 0

    def launch(self, wb: DecoderBatch) -> StepOutput:
        mode, x = wb.forward_mode, wb.inputs
        self.forwards[mode.value] = self.forwards.get(mode.value, 0) + 1
        ids = x.input_ids.tolist()
        if wb.input_ids_device is not None:  # the first rows' inputs, from the step before
            n = wb.input_ids_device.numel()
            ids[:n] = wb.input_ids_device.tolist()
        pos = x.positions.tolist()
        loc = x.out_cache_loc.tolist()
        assert len(ids) == len(pos) == len(loc) == sum(x.extend_lens)
        assert len(set(loc)) == len(loc) and min(loc) >= self.token_to_kv_pool.page_size, \
            "every new token needs its own slot, never the scratch page"
        if mode is ForwardMode.DECODE:
            rows = list(range(len(ids)))  # one token per row
        else:
            assert mode is ForwardMode.EXTEND
            rows, end = [], 0
            for n in x.extend_lens:
                end += n
                rows.append(end - 1)  # each request's last token
        self.rows_seen += len(rows)
        out = torch.tensor([next_token(ids[r], pos[r], self.vocab) for r in rows])
        return StepOutput(out).copy_to_host()

    def forward_encode(self, batch: EncodeBatch) -> torch.Tensor:
        self.forwards["encode"] = self.forwards.get("encode", 0) + 1
        return torch.zeros(sum(batch.segment_lens), 1)
