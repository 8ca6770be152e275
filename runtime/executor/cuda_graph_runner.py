"""CUDA graphs for decode steps: the whole decoder forward (self-attention with the in-kernel
T5 bias, cross-attention over each request's encoder K/V, the LM head and a greedy argmax) is
captured once per batch-size bucket and replayed, so a decode step costs one host-to-device
copy and one graph launch instead of a thousand kernel launches.

A replay pads the batch to its bucket with a dummy request (a table row of its own, scratch
KV page 0, no encoder keys); encoder lengths, decoder lengths and key ranges are graph inputs.

Short prefills replay the same graphs, one row per new token (`worker_batch.decode_rows`):
a cached image's 16-token prompt, or T5's one start token per request, then costs one graph
launch instead of an eager pass whose ~850 kernel launches take longer than the GPU's work.
"""

from __future__ import annotations

import logging

import torch

from seq2serve.runtime.attention.forward_batch import ForwardBatch, ForwardMode
from seq2serve.runtime.executor.worker_batch import ModelWorkerBatch
from seq2serve.runtime.kernels.triton_decode import num_kv_splits

logger = logging.getLogger(__name__)

_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256,
            320, 384, 448, 512)
# rows of the packed per-step input, uploaded with one copy
_FIELDS = ("input_ids", "positions", "out_cache_loc", "req_pool_indices", "seq_lens",
           "encoder_lens", "cross_kv_start", "cross_kv_end")


class CudaGraphRunner:
    def __init__(self, runner, max_bs: int, max_prefill_tokens: int = 0) -> None:
        self.runner = runner
        self.max_decode_bs = max_bs
        self.max_prefill_tokens = max_prefill_tokens
        max_bs = max(max_bs, max_prefill_tokens)
        self.buckets = [b for b in _BUCKETS if b < max_bs] + [max_bs]
        self.max_bs = max_bs
        self.ranged = runner.uses_cross_ranges  # Mllama: per-request image key ranges
        n = len(_FIELDS)
        # two pinned staging buffers, used in turn: with the overlap schedule the next step
        # is staged while the copy of this one may still be queued behind the running graph
        self.hosts = [torch.zeros((n, max_bs), dtype=torch.int64, pin_memory=True)
                      for _ in range(2)]
        self.host = self.hosts[0]
        self.dev = torch.zeros((n, max_bs), dtype=torch.int64, device=runner.device)
        self.row = {name: i for i, name in enumerate(_FIELDS)}
        self.pad = {"req_pool_indices": runner.req_to_token_pool.dummy_row, "seq_lens": 1}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.fbs: dict[int, ForwardBatch] = {}
        self.splits: dict[int, tuple[int, int]] = {}  # KV splits (self, cross) per bucket
        self._capture()

    def can_run(self, wb: ModelWorkerBatch) -> bool:
        return (wb.forward_mode is ForwardMode.DECODE
                and len(wb.req_pool_indices) <= self.max_decode_bs
                and (wb.cross_kv_start is not None) == self.ranged)

    def can_run_prefill(self, wb: ModelWorkerBatch) -> bool:
        """An EXTEND batch short enough to replay as decode rows (one per new token); a batch
        of one token per request (T5's start tokens) is a decode batch in all but name."""
        tokens = sum(wb.extend_lens)
        limit = self.max_decode_bs if tokens == len(wb.extend_lens) else self.max_prefill_tokens
        return (wb.forward_mode is ForwardMode.EXTEND and 0 < tokens <= limit
                and (wb.cross_kv_start is not None) == self.ranged)

    # --- capture -----------------------------------------------------------------------------
    def _forward_batch(self, bs: int) -> ForwardBatch:
        r = self.runner
        v = {name: self.dev[i, :bs] for i, name in enumerate(_FIELDS)}
        ctx = r.context_len
        fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE, batch_size=bs, input_ids=v["input_ids"],
            positions=v["positions"], out_cache_loc=v["out_cache_loc"],
            req_pool_indices=v["req_pool_indices"], seq_lens=v["seq_lens"],
            extend_lens=None, encoder_lens=v["encoder_lens"], encoder_input_ids=None,
            cross_out_loc=None, cross_kv_start=v["cross_kv_start"] if self.ranged else None,
            cross_kv_end=v["cross_kv_end"] if self.ranged else None, encoder_images=None,
            cached_hidden=None, seq_lens_cpu=[ctx] * bs, extend_lens_cpu=[1] * bs,
            encoder_lens_cpu=[r.max_encoder_len] * bs, req_pool_indices_cpu=[], **{
                "req_to_token_pool": r.req_to_token_pool, "token_to_kv_pool": r.token_to_kv_pool,
                "cross_kv_pool": r.cross_kv_pool, "attn_backend": r.attn_backend})
        heads = r.token_to_kv_pool.num_kv_heads
        self.splits[bs] = (num_kv_splits(bs, heads, ctx, r.attn_backend.num_sms),
                           num_kv_splits(bs, heads, max(r.max_encoder_len, 1),
                                         r.attn_backend.num_sms))
        return fb

    def _body(self, fb: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        r = self.runner
        # inside the capture: the metadata's own device ops (key-range clamps) replay too
        r.attn_backend.init_graph_metadata(fb, *self.splits[fb.batch_size])
        r.req_to_token_pool.req_to_token[fb.req_pool_indices, fb.positions] = \
            fb.out_cache_loc.int()
        hidden = r.model(fb.input_ids, fb.positions, fb)
        logits = r.model.compute_logits(hidden)
        return logits, logits.argmax(dim=-1)

    @torch.inference_mode()
    def _capture(self) -> None:
        self._fill_padding(0, self.max_bs)
        self.dev.copy_(self.host)
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for bs in reversed(self.buckets):  # largest first: later ones reuse its memory
                fb = self._forward_batch(bs)
                for _ in range(2):  # compile and warm up outside the capture
                    self._body(fb)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    self.outputs[bs] = self._body(fb)
                self.graphs[bs], self.fbs[bs] = graph, fb
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        logger.info("captured CUDA graphs for decode batch sizes %s", self.buckets)

    # --- replay ------------------------------------------------------------------------------
    def _fill_padding(self, start: int, end: int) -> None:
        for name, i in self.row.items():
            self.host[i, start:end] = self.pad.get(name, 0)

    @torch.inference_mode()
    def replay(self, wb: ModelWorkerBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [bs, vocab], greedy ids [bs]) of a decode batch."""
        bs = len(wb.req_pool_indices)
        bucket = next(b for b in self.buckets if b >= bs)
        self.host = self.hosts[1] if self.host is self.hosts[0] else self.hosts[0]
        h, row = self.host, self.row
        if wb.input_ids_device is None:
            h[row["input_ids"], :bs] = wb.input_ids
        h[row["positions"], :bs] = wb.positions
        h[row["out_cache_loc"], :bs] = wb.out_cache_loc
        h[row["req_pool_indices"], :bs] = torch.tensor(wb.req_pool_indices)
        h[row["seq_lens"], :bs] = torch.tensor(wb.seq_lens)
        h[row["encoder_lens"], :bs] = torch.tensor(wb.encoder_lens)
        if self.ranged:
            h[row["cross_kv_start"], :bs] = wb.cross_kv_start
            h[row["cross_kv_end"], :bs] = wb.cross_kv_end
        self._fill_padding(bs, bucket)
        self.dev[:, :bucket].copy_(h[:, :bucket], non_blocking=True)
        if wb.input_ids_device is not None:  # sampled by the step before, never on the host
            self.dev[row["input_ids"], :bs].copy_(wb.input_ids_device)
        self.graphs[bucket].replay()
        logits, ids = self.outputs[bucket]
        return logits[:bs], ids[:bs]
