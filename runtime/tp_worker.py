"""TpModelWorker: the scheduler's handle on the model. One per tensor-parallel rank; with one
rank it runs the ModelRunner and hands results back as host data."""

from __future__ import annotations

from dataclasses import dataclass, field

from seq2serve.runtime.forward_batch import ModelWorkerBatch
from seq2serve.runtime.model_config import ModelConfig
from seq2serve.runtime.model_runner import ModelRunner
from seq2serve.runtime.server_args import ServerArgs


@dataclass
class GenerationResult:
    next_token_ids: list[int]
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    logits: object = field(default=None, repr=False)  # only when the runner keeps them


class TpModelWorker:
    def __init__(self, args: ServerArgs, model_config: ModelConfig) -> None:
        self.model_runner = ModelRunner(args, model_config)

    def forward_encode(self, wb: ModelWorkerBatch):
        """Write cross K/V; returns the encoder's new hidden states (packed), if it ran."""
        return self.model_runner.forward(wb).encoder_hidden

    def forward_generation(self, wb: ModelWorkerBatch) -> GenerationResult:
        out = self.model_runner.forward(wb)
        s = out.sample
        result = GenerationResult(next_token_ids=s.next_token_ids.tolist(), logits=out.logits)
        if s.logprobs is not None:
            result.logprobs = s.logprobs.tolist()
        if s.top_logprobs is not None:
            ids, vals = s.top_logprob_ids.tolist(), s.top_logprobs.tolist()
            result.top_logprobs = [list(zip(i, v)) for i, v in zip(ids, vals)]
        return result
