"""The encoder stage: fills the cross-attention K/V that newly admitted requests still miss.

One ENCODE forward per scheduler step at most: the encoder runs once per distinct new input
(text, or a model-owned payload, batched through its own type) over one packed, unpadded
batch; inputs whose hidden states are cached only get their K/V projections. New hidden states
are offered to the encoder cache's warm tier, and each input's pooled output (its embedding:
the mean over its tokens, L2-normalised) is kept with its cache entry.

Nothing here waits for the device. The passes are queued on the device's current stream, the
one the decoder forwards run on, so the next forward (a decode step that reads the new cross
K/V) is ordered after them without a synchronize, and the step in flight before them is not
drained. A handle is `ready` once its writes are queued. (An encoder on a side stream would
record an event here and make the decoder's stream wait on it before the next launch.)
"""

from __future__ import annotations

import time

import torch

from seq2serve.encoders.encoder_cache import EncoderCache, EncoderJob, EncodeWork
from seq2serve.runtime.executor.worker_batch import EncodeBatch


def pooled(hidden: torch.Tensor, lens: list[int]) -> torch.Tensor:
    """Each segment's mean over its rows of `hidden` [tokens, d] (the segments packed in
    order), L2-normalised, in float32: [segments, d]. A few kernels per pass, not per input;
    the segment ids are built on the host and uploaded pinned, so nothing waits for the
    device."""
    n = torch.tensor(lens)
    segment = torch.repeat_interleave(torch.arange(len(lens)), n)
    if hidden.is_cuda:
        n, segment = (t.pin_memory().to(hidden.device, non_blocking=True) for t in (n, segment))
    sums = torch.zeros(len(lens), hidden.shape[-1], dtype=torch.float32, device=hidden.device)
    sums.index_add_(0, segment, hidden.float())
    return torch.nn.functional.normalize(sums / n[:, None], dim=-1)


class EncoderStage:
    def __init__(self, worker, cache: EncoderCache, max_batch_tokens: int) -> None:
        self.worker = worker
        self.cache = cache
        self.max_batch_tokens = max_batch_tokens  # bounds the activations of one pass
        # payloads' batches page-locked on the host when the encoder runs on a GPU
        self.pin = str(worker.device).startswith("cuda")
        self.num_forwards = 0  # encoder passes run (tests count them)
        self.num_encoded_inputs = 0
        self.num_projected_inputs = 0  # warm hits: K/V projected from cached hidden states
        self._seconds = 0.0
        # CUDA: (start, end) events of stage runs whose device time is not read yet
        self._timing: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    @property
    def seconds(self) -> float:
        """Time of the encoder passes: the device's (CUDA events, read once they are done:
        a run still on the device counts later), or the wall time on a CPU."""
        self._read_timing()
        return self._seconds

    def _read_timing(self) -> None:
        still = []
        for start, end in self._timing:
            if end.query():
                self._seconds += start.elapsed_time(end) / 1e3
            else:
                still.append((start, end))
        self._timing = still

    def run(self, jobs: list[EncoderJob]) -> None:
        """Queue the writes of every job's cross K/V, in passes of at most max_batch_tokens
        inputs' tokens; returns without waiting for the device."""
        self._read_timing()  # (keeps the list short when nobody reads `seconds`)
        cuda = str(self.worker.device).startswith("cuda")
        start = torch.cuda.Event(enable_timing=True) if cuda else time.perf_counter()
        if cuda:
            start.record()
        chunk: list[EncoderJob] = []
        size = 0
        for j in jobs:
            if chunk and size + j.segment.length > self.max_batch_tokens:
                self._run(chunk)
                chunk, size = [], 0
            chunk.append(j)
            size += j.segment.length
        if chunk:
            self._run(chunk)
        if cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._timing.append((start, end))
        else:
            self._seconds += time.perf_counter() - start

    def _run(self, jobs: list[EncoderJob]) -> None:
        encode = [j for j in jobs if j.work is EncodeWork.ENCODE]
        project = [j for j in jobs if j.work is EncodeWork.PROJECT]
        payloads = [j.segment.payload for j in encode if j.segment.payload is not None]
        token_jobs = [j for j in encode if j.segment.token_ids is not None]
        batch = EncodeBatch(
            token_ids=torch.tensor([t for j in token_jobs for t in j.segment.token_ids])
            if token_jobs else None,
            model_input=type(payloads[0]).batch(payloads, pin=self.pin) if payloads else None,
            segment_lens=[j.segment.length for j in encode],
            # cross K/V slots: the encoded inputs first, then the projected ones
            cross_out_loc=torch.cat([j.entry.handle.loc for j in encode + project]),
            cached_hidden=torch.cat([j.entry.hidden for j in project]) if project else None,
        )
        hidden = self.worker.forward_encode(batch)
        if encode:
            self.num_forwards += 1
            offset = 0
            for j, e in zip(encode, pooled(hidden, batch.segment_lens)):
                self.cache.keep_hidden(j.entry, hidden[offset:offset + j.segment.length].clone())
                j.entry.embedding = e
                offset += j.segment.length
        missing = [j for j in project if j.entry.embedding is None]
        if missing:  # (their hidden states were cached before the entry had an embedding)
            lens = [j.segment.length for j in missing]
            for j, e in zip(missing, pooled(torch.cat([j.entry.hidden for j in missing]), lens)):
                j.entry.embedding = e
        for j in encode + project:
            j.entry.handle.ready = True
        self.num_encoded_inputs += len(encode)
        self.num_projected_inputs += len(project)
