"""CUDA graphs for decode steps: the whole decoder forward (self-attention with the in-kernel
T5 bias, cross-attention over each request's encoder K/V, the LM head and a greedy argmax) is
captured once per batch-size bucket and replayed, so a decode step costs one host-to-device
copy and one graph launch instead of a thousand kernel launches.

A replay pads the batch to its bucket with a dummy request (a table row of its own, scratch
KV page 0, no encoder keys); encoder lengths, decoder lengths and key ranges are graph inputs.

Short prefills replay the same graphs, one row per new token (`worker_batch.decode_rows`):
a 16-token prompt over a cached encoder input, or T5's one start token per request, then
costs one graph launch instead of an eager pass whose ~850 kernel launches take longer than
the GPU's work.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from seq2serve.runtime.attention.forward_batch import (
    DecoderInputs,
    ForwardBatch,
    ForwardMode,
    input_fields,
)
from seq2serve.runtime.executor.worker_batch import DecoderBatch
from seq2serve.runtime.kernels.triton_decode import num_kv_splits

logger = logging.getLogger(__name__)

_GRAPH_BEAMS = 16  # the largest beam group a graph's cross-attention grid is planned for
_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256,
            320, 384, 448, 512)


class CudaGraphRunner:
    def __init__(self, runner, max_bs: int, max_prefill_tokens: int = 0) -> None:
        self.runner = runner
        self.max_decode_bs = max_bs
        self.max_prefill_tokens = max_prefill_tokens
        max_bs = max(max_bs, max_prefill_tokens)
        self.buckets = [b for b in _BUCKETS if b < max_bs] + [max_bs]
        self.max_bs = max_bs
        # the optional inputs the model reads (Mllama: each token's cross key range)
        self.optional = runner.model_optional_inputs
        # cross-attention reads each beam group's K/V once, for groups of up to this many rows
        # (a batch with a larger group runs eagerly); rows without beams are groups of one
        self.graph_beams = _GRAPH_BEAMS if runner.cross_kv_pool is not None else 0
        # the static input: one row per DecoderInputs field, uploaded with one copy
        self.fields = input_fields()
        self.row = {f.name: i for i, f in enumerate(self.fields)}
        self.pad = {f.name: f.metadata["pad"] for f in self.fields}
        self.pad["req_pool_indices"] = runner.req_to_token_pool.dummy_row  # a row of its own
        n = len(self.fields)
        # two pinned staging buffers, used in turn: with the overlap schedule the next step
        # is staged while the copy of this one may still be queued behind the running graph
        self.hosts = [torch.zeros((n, max_bs), dtype=torch.int64, pin_memory=True)
                      for _ in range(2)]
        self.host = self.hosts[0]
        self.dev = torch.zeros((n, max_bs), dtype=torch.int64, device=runner.device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.fbs: dict[int, ForwardBatch] = {}
        self.splits: dict[int, tuple[int, int]] = {}  # KV splits (self, cross) per bucket
        self._capture()

    def can_run(self, wb: DecoderBatch) -> bool:
        return (wb.forward_mode is ForwardMode.DECODE and wb.batch_size <= self.max_decode_bs
                and wb.inputs.present() == self.optional and self._groups_fit(wb))

    def _groups_fit(self, wb: DecoderBatch) -> bool:
        """The batch's beam groups fit the graphs' cross-attention grid (only a batch with
        beam rows can hold a group of more than one)."""
        if not self.graph_beams or wb.sampling is None or not wb.sampling.beam_rows:
            return True
        return max(wb.inputs.cross_group_lens) <= self.graph_beams

    def can_run_prefill(self, wb: DecoderBatch) -> bool:
        """An EXTEND batch short enough to replay as decode rows (one per new token); a batch
        of one token per request (T5's start tokens) is a decode batch in all but name."""
        lens = wb.inputs.extend_lens
        tokens = sum(lens)
        limit = self.max_decode_bs if tokens == len(lens) else self.max_prefill_tokens
        return (wb.forward_mode is ForwardMode.EXTEND and 0 < tokens <= limit
                and wb.inputs.present() == self.optional)

    # --- capture -----------------------------------------------------------------------------
    def _forward_batch(self, bs: int) -> ForwardBatch:
        r = self.runner
        # views of the static buffer (int64 throughout: the kernels take either width)
        views = {f.name: (self.dev[i, :bs]
                          if not f.metadata["optional"] or f.name in self.optional else None)
                 for i, f in enumerate(self.fields)}
        ctx = r.context_len
        # host lengths: the largest a replay may have (they size nothing the graph keeps)
        host = DecoderInputs(req_pool_indices=[], seq_lens=[ctx] * bs, extend_lens=[1] * bs,
                             encoder_lens=[r.max_encoder_len] * bs)
        fb = ForwardBatch(**views, forward_mode=ForwardMode.DECODE, host=host,
                          req_to_token_pool=r.req_to_token_pool,
                          token_to_kv_pool=r.token_to_kv_pool, cross_kv_pool=r.cross_kv_pool,
                          attn_backend=r.attn_backend)
        heads = r.token_to_kv_pool.num_kv_heads
        self.splits[bs] = (num_kv_splits(bs, heads, ctx, r.attn_backend.num_sms),
                           num_kv_splits(bs, heads, max(r.max_encoder_len, 1),
                                         r.attn_backend.num_sms))
        return fb

    def _body(self, fb: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        r = self.runner
        # inside the capture: the metadata's own device ops (key-range clamps) replay too
        r.attn_backend.init_graph_metadata(fb, *self.splits[fb.batch_size],
                                           beams=self.graph_beams)
        r.req_to_token_pool.req_to_token[fb.req_pool_indices, fb.positions] = \
            fb.out_cache_loc.int()
        hidden = r.model(fb.input_ids, fb.positions, fb)
        logits = r.model.compute_logits(hidden)
        return logits, r.sampler.greedy(logits)

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
            self.host[i, start:end] = self.pad[name]

    @torch.inference_mode()
    def replay(self, wb: DecoderBatch, started: torch.cuda.Event | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [bs, vocab], greedy ids [bs]) of a decode batch. `started` is recorded just
        before the step's first device work (the input copy)."""
        bs = wb.batch_size
        bucket = next(b for b in self.buckets if b >= bs)
        self.host = self.hosts[1] if self.host is self.hosts[0] else self.hosts[0]
        for name, i in self.row.items():
            value = getattr(wb.inputs, name)
            if isinstance(value, list):  # (through numpy: a third of torch's time on ints)
                self.host[i, :bs] = torch.from_numpy(np.array(value))
            elif value is not None:
                self.host[i, :bs] = torch.as_tensor(value)
            else:  # (not the last batch's values)
                self.host[i, :bs] = self.pad[name]
        self._fill_padding(bs, bucket)
        if started is not None:
            started.record()
        self.dev[:, :bucket].copy_(self.host[:, :bucket], non_blocking=True)
        if wb.input_ids_device is not None:  # the first rows' inputs: sampled by the step
            n = wb.input_ids_device.numel()  # before, never on the host (the rest: staged)
            self.dev[self.row["input_ids"], :n].copy_(wb.input_ids_device)
        self.graphs[bucket].replay()
        logits, ids = self.outputs[bucket]
        return logits[:bs], ids[:bs]
