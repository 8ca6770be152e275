"""ModelWorker: the scheduler's handle on the model (the executor), running the ModelRunner.
`launch` returns at once with the sampled tokens still on the device (their copy to the host
already queued); `StepOutput.wait()` waits for them, so the scheduler can prepare the next
step while the device works on this one.

With `tp_size` N > 1 this process is rank 0: the worker starts ranks 1..N-1 first
(executor/tp_ranks.py) and sends each batch to them before running it on its own shard. At
tp_size 1 nothing of that exists."""

from __future__ import annotations

from collections.abc import Callable

import torch

from seq2serve.models.cpu_ops import cached_gemm_shapes
from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.executor.model_runner import ModelRunner
from seq2serve.runtime.executor.sampler import StepOutput
from seq2serve.runtime.executor.worker_batch import DecoderBatch, EncodeBatch


class ModelWorker:
    def __init__(self, args: ServerArgs, model_config: ModelConfig) -> None:
        self.ranks = None
        if args.tp_size > 1:
            from seq2serve.runtime.executor.tp_ranks import TensorParallelRanks

            self.ranks = TensorParallelRanks(args, model_config)
        self.model_runner = ModelRunner(args, model_config)
        r = self.model_runner
        self.device = r.device
        self.req_to_token_pool = r.req_to_token_pool
        self.token_to_kv_pool = r.token_to_kv_pool
        self.cross_kv_pool = r.cross_kv_pool
        if self.ranks is not None:
            self.ranks.mirror(r.pools)

    def mirror(self, pools: dict) -> None:
        """Pools besides the runner's whose copies every rank makes (the host tier's, named
        as the ranks name theirs); nothing at tp_size 1."""
        if self.ranks is not None:
            self.ranks.mirror(pools)

    def layout(self) -> dict:
        """Where the model runs: the ranks and their devices (the startup line, stats)."""
        size = self.model_runner.tp.size
        if size == 1:
            return {"tp_size": 1, "tp_devices": [self.device]}
        from seq2serve.runtime.executor.tp_ranks import rank_device

        return {"tp_size": size, "tp_devices": [rank_device(self.device, r)
                                                for r in range(size)]}

    def host_caches(self) -> dict:
        """What the model's ops keep on the host past the weights (stats): the product shapes
        oneDNN holds a primitive for, about 0.55 MB each (models/cpu_ops.py)."""
        shapes = cached_gemm_shapes()
        return {} if shapes is None else {"cpu_gemm_shapes": shapes}

    def forward_encode(self, batch: EncodeBatch) -> torch.Tensor | None:
        """Write cross K/V; returns the encoder's new hidden states (packed), if it ran."""
        if self.ranks is not None:
            self.ranks.send("encode", batch)
        return self.model_runner.encode(batch)

    def launch(self, batch: DecoderBatch) -> StepOutput:
        if self.ranks is not None:
            self.ranks.send("forward", batch)
        return self.model_runner.forward(batch).copy_to_host()

    @property
    def late_sampling(self) -> bool:
        """Whether `launch_forward` is available: at tp_size 1 (the other ranks sample from
        the batch they were sent, which would need the late fields sent after it)."""
        return self.ranks is None

    def launch_forward(self, batch: DecoderBatch) -> Callable[[], StepOutput]:
        """`launch` in two halves: the forward is queued now; the returned call queues the
        sampler, with what the host has filled into `batch.sampling` meanwhile (the grammar
        masks of rows whose last token was still on the device), and the copy to the host."""
        assert self.ranks is None, "late sampling runs at tp_size 1"
        sample = self.model_runner.forward(batch, defer=True)
        return lambda: sample().copy_to_host()
