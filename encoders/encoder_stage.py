"""The encoder stage: runs the encoder once per new encoder input, over one packed ragged batch,
and leaves each request's cross-attention K/V in its CrossKVPool slots."""

from __future__ import annotations

from seq2serve.runtime.req import Req
from seq2serve.runtime.schedule_batch import ScheduleBatch


class EncoderStage:
    def __init__(self, worker) -> None:
        self.worker = worker
        self.num_forwards = 0  # encoder passes run (tests count them)
        self.num_encoded_tokens = 0

    def run(self, reqs: list[Req]) -> ScheduleBatch:
        """Encode every request in `reqs` whose cross K/V are not ready yet."""
        todo = [r for r in reqs if r.needs_encoder]
        batch = ScheduleBatch.encode(todo)
        self.worker.forward_encode(batch.worker_batch)
        for r in todo:
            r.cross_kv.ready = True
        self.num_forwards += 1
        self.num_encoded_tokens += sum(r.encoder_len for r in todo)
        return batch
