"""A stand-in for the ModelWorker that needs no model: real (tiny) pools, and a next token that
is a fixed function of the previous token and its position, so that what a request generates
does not depend on what it was batched with, retracted or overlapped with. Scheduler tests
drive it in milliseconds and compare with `alone`, the same rule applied to one request.

Beam rows (a step whose sampling batch has `beam_rows`) get logits instead: a fixed row of
random numbers for each (previous token, position), a fifth of them led by EOS, through the
real `Sampler` (the beam candidates and HF's rules, on the CPU) and `move_pages`, so a beam
request's result depends on its own rows only, and a group batched with hundreds of others
must end as it ends alone. (The pools' K/V are never read: what the fake checks is the
scheduler's bookkeeping of tokens, scores, rows and pages, not the K/V's content.) The rows
after the beam rows keep the rule above."""

from __future__ import annotations

import time

import torch

from seq2serve.cross_attention.cross_kv_pool import CrossKVPool
from seq2serve.runtime.attention.forward_batch import ForwardMode
from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.executor.beam_step import move_pages
from seq2serve.runtime.executor.sampler import Sampler, StepOutput
from seq2serve.runtime.executor.worker_batch import DecoderBatch, EncodeBatch
from seq2serve.runtime.memory.req_to_token_pool import ReqToTokenPool
from seq2serve.runtime.memory.token_to_kv_pool import TokenToKVPool

_LOGIT_ROWS = 97  # (previous token, position) -> a row of the beam logits' table, mod this


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
        self.seconds = 0.0  # its own time in launch and forward_encode (the host benchmarks')
        self.sampler = Sampler()  # (beam rows only; its state: the groups' arenas)
        self.eos_ids = model_config.eos_token_ids
        self.beam_logits: torch.Tensor | None = None  # (made at the first beam step)

    def launch(self, wb: DecoderBatch) -> StepOutput:
        start = time.perf_counter()
        try:
            return self._launch(wb)
        finally:
            self.seconds += time.perf_counter() - start

    def _launch(self, wb: DecoderBatch) -> StepOutput:
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
        sb = wb.sampling
        if sb is not None and sb.beam_rows:
            return self._beam_step(wb, [ids[r] for r in rows], [pos[r] for r in rows], out)
        return StepOutput(out).copy_to_host()

    def _beam_step(self, wb: DecoderBatch, ids: list[int], pos: list[int],
                   plain: torch.Tensor) -> StepOutput:
        """The sampled rows' logits from the table, the real sampler (beam candidates and
        rules) and page moves over them; the rows after the beam rows keep `next_token`."""
        sb = wb.sampling
        if self.beam_logits is None:  # a row for each (previous token, position), mod 97
            gen = torch.Generator().manual_seed(0)
            self.beam_logits = torch.randn(_LOGIT_ROWS, self.vocab, generator=gen)
            # (every fifth row puts an EOS first: hypotheses end at different lengths)
            top = self.beam_logits[::5].max(dim=1).values
            for eos in self.eos_ids:
                self.beam_logits[::5, eos] = top + 0.5
        at = (torch.tensor(ids) * 31 + torch.tensor(pos) * 7 + 3) % _LOGIT_ROWS
        out = self.sampler(self.beam_logits[at], sb)
        out.next_token_ids[sb.beam_rows:] = plain[sb.beam_rows:]
        if sb.beam_moves is not None:  # (as the model runner does after its sampler)
            move_pages(self.req_to_token_pool.req_to_token, self.token_to_kv_pool,
                       sb.beam_moves, out.beam_parents)
        return out.copy_to_host()

    def forward_encode(self, batch: EncodeBatch) -> torch.Tensor:
        start = time.perf_counter()
        self.forwards["encode"] = self.forwards.get("encode", 0) + 1
        out = torch.zeros(sum(batch.segment_lens), 1)
        self.seconds += time.perf_counter() - start
        return out
