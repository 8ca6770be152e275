"""TpModelWorker: the scheduler's handle on the model. One per tensor-parallel rank; with one
rank it runs the ModelRunner. `launch` returns at once with the sampled tokens still on the
device (their copy to the host already queued); `PendingResult.result()` waits for them, so
the scheduler can prepare the next step while the device works on this one."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from seq2serve.runtime.forward_batch import ModelWorkerBatch
from seq2serve.runtime.model_config import ModelConfig
from seq2serve.runtime.model_runner import ModelRunner
from seq2serve.runtime.sampler import SampleOutput
from seq2serve.runtime.server_args import ServerArgs


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


class TpModelWorker:
    def __init__(self, args: ServerArgs, model_config: ModelConfig) -> None:
        self.model_runner = ModelRunner(args, model_config)

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

    def forward_generation(self, wb: ModelWorkerBatch) -> GenerationResult:
        return self.launch(wb).result()
