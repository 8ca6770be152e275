"""ModelWorker: the scheduler's handle on the model (the executor), running the ModelRunner.
`launch` returns at once with the sampled tokens still on the device (their copy to the host
already queued); `StepOutput.wait()` waits for them, so the scheduler can prepare the next
step while the device works on this one."""

from __future__ import annotations

import torch

from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.executor.model_runner import ModelRunner
from seq2serve.runtime.executor.sampler import StepOutput
from seq2serve.runtime.executor.worker_batch import DecoderBatch, EncodeBatch


class ModelWorker:
    def __init__(self, args: ServerArgs, model_config: ModelConfig) -> None:
        self.model_runner = ModelRunner(args, model_config)
        r = self.model_runner
        self.device = r.device
        self.req_to_token_pool = r.req_to_token_pool
        self.token_to_kv_pool = r.token_to_kv_pool
        self.cross_kv_pool = r.cross_kv_pool

    def forward_encode(self, batch: EncodeBatch) -> torch.Tensor | None:
        """Write cross K/V; returns the encoder's new hidden states (packed), if it ran."""
        return self.model_runner.encode(batch)

    def launch(self, batch: DecoderBatch) -> StepOutput:
        return self.model_runner.forward(batch).copy_to_host()
