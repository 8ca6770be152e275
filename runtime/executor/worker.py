"""ModelWorker: the scheduler's handle on the model (the executor), running the ModelRunner.
`launch` returns at once with the sampled tokens still on the
device (their copy to the host already queued); `PendingResult.result()` waits for them, so
the scheduler can prepare the next step while the device works on this one."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.executor.model_runner import ModelRunner
from seq2serve.runtime.executor.sampler import SampleOutput
from seq2serve.runtime.executor.worker_batch import ModelWorkerBatch


@dataclass
class GenerationResult:
    next_token_ids: list[int]
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    logits: object = field(default=None, repr=False)  # only when the runner keeps them


@dataclass
class PendingResult:
    device_ids: torch.Tensor  # sampled tokens, on the device: the next decode step's input
    host: SampleOutput  # the same on the host (pinned; valid once `event` has completed)
    event: torch.cuda.Event | None
    logits: torch.Tensor | None = None

    def result(self) -> GenerationResult:
        if self.event is not None:
            self.event.synchronize()
        h = self.host
        out = GenerationResult(next_token_ids=h.next_token_ids.tolist(), logits=self.logits)
        if h.logprobs is not None:
            out.logprobs = h.logprobs.tolist()
        if h.top_logprobs is not None:
            ids, vals = h.top_logprob_ids.tolist(), h.top_logprobs.tolist()
            out.top_logprobs = [list(zip(i, v)) for i, v in zip(ids, vals)]
        return out


class ModelWorker:
    def __init__(self, args: ServerArgs, model_config: ModelConfig) -> None:
        self.model_runner = ModelRunner(args, model_config)
        r = self.model_runner
        self.device = r.device
        self.req_to_token_pool = r.req_to_token_pool
        self.token_to_kv_pool = r.token_to_kv_pool
        self.cross_kv_pool = r.cross_kv_pool

    def forward_encode(self, wb: ModelWorkerBatch):
        """Write cross K/V; returns the encoder's new hidden states (packed), if it ran."""
        return self.model_runner.forward(wb).encoder_hidden

    def launch(self, wb: ModelWorkerBatch) -> PendingResult:
        out = self.model_runner.forward(wb)
        s = out.sample
        if not s.next_token_ids.is_cuda:
            return PendingResult(s.next_token_ids, s, None, out.logits)

        def host(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None:
                return None
            pinned = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            return pinned.copy_(t, non_blocking=True)

        copied = SampleOutput(host(s.next_token_ids), host(s.logprobs),
                              host(s.top_logprob_ids), host(s.top_logprobs))
        event = torch.cuda.Event()
        event.record()
        return PendingResult(s.next_token_ids, copied, event, out.logits)
