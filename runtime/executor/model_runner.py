"""ModelRunner: owns the model, the pools and the attention backend on one device; runs one
DecoderBatch or EncodeBatch at a time and samples."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import torch
import torch.distributed as dist

from seq2serve.cross_attention.cross_kv_pool import CrossKVPool
from seq2serve.models import parallel_state
from seq2serve.models.loader import load_model
from seq2serve.runtime.attention import create_backend
from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.config.serving_dtype import serving_dtype
from seq2serve.runtime.executor.beam_step import move_pages
from seq2serve.runtime.executor.encode_buckets import pad_encode_batch
from seq2serve.runtime.executor.sampler import Sampler, StepOutput
from seq2serve.runtime.executor.worker_batch import (
    DecoderBatch,
    EncodeBatch,
    decode_rows,
    to_encode_forward_batch,
    to_forward_batch,
)
from seq2serve.runtime.memory.budget import available_bytes, plan_pools
from seq2serve.runtime.memory.req_to_token_pool import ReqToTokenPool
from seq2serve.runtime.memory.token_to_kv_pool import TokenToKVPool

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DEFAULT_MAX_LEN = 2048
# scored input tokens whose logits exist at once (a long scored prompt would otherwise hold
# rows x vocab floats: 1024 rows of a 128k vocabulary are 0.5 GB in float32)
_SCORED_ROWS_AT_ONCE = 1024


def resolve_dtype(args: ServerArgs, model_config: ModelConfig, device: str) -> torch.dtype:
    """`--dtype`, or auto's choice (config/serving_dtype.py), logged when it is not the
    checkpoint's."""
    cuda = device.startswith("cuda")
    chosen = serving_dtype(args.dtype, model_config.checkpoint_dtype, model_config.architecture,
                           device, cuda and args.dtype == "auto" and torch.cuda.is_bf16_supported())
    if chosen.note:
        logger.warning(chosen.note)
    return _DTYPES[chosen.name]


class ModelRunner:
    """With tensor parallelism, one per rank (`device`: the rank's), each holding its shard
    of the model and its heads' slice of the K/V pools (models/parallel_state.py)."""

    def __init__(self, args: ServerArgs, model_config: ModelConfig,
                 device: str | None = None) -> None:
        self.args = args
        self.model_config = model_config
        self.device = device or args.resolved_device()
        self.tp = parallel_state.tensor_parallel()
        self.dtype = resolve_dtype(args, model_config, self.device)
        if self.device.startswith("cuda"):
            torch.cuda.set_device(torch.device(self.device))
        torch.manual_seed(args.random_seed)
        self.model = load_model(model_config, self.device, self.dtype, args.load_format,
                                quantization=args.quantization,
                                quantize_lm_head=args.quantize_lm_head,
                                int8_activations=args.int8_activations)
        self._init_pools()
        self.backend_name = args.resolved_attention_backend(self.device)
        self.attn_backend = create_backend(self.backend_name, device=self.device)
        self.sampler = Sampler(model_config.suppressed_token_ids, self.device)
        # the optional DecoderInputs the model reads (Mllama: each token's cross key range)
        self.model_optional_inputs = frozenset(self.model.optional_inputs)
        # token inputs' encoder passes padded to a few sizes (encode_buckets.py): on CUDA,
        # where a GEMM of a new row count costs milliseconds of cuBLAS's choosing
        self.encode_buckets = self.device.startswith("cuda")
        if args.compile_encoder and not self.model.compile_encoder():
            logger.warning("--compile-encoder: %s has no encoder part it compiles; ignored",
                           type(self.model).__name__)
        if self.device.startswith("cuda") and model_config.arch.is_encoder_decoder:
            self._warm_encoder()
        self.graph_runner = None
        if (self.device.startswith("cuda") and self.backend_name == "triton"
                and not args.disable_cuda_graph):
            from seq2serve.runtime.executor.cuda_graph_runner import CudaGraphRunner

            self.graph_runner = CudaGraphRunner(
                self, min(args.cuda_graph_max_bs, args.max_running_requests),
                args.cuda_graph_max_prefill_tokens)

    def _init_pools(self) -> None:
        a, arch = self.args, self.model_config.arch
        self.context_len = a.context_length or arch.max_length or _DEFAULT_MAX_LEN
        self.max_encoder_len = 0
        if arch.is_encoder_decoder:
            # an encoder of its own length (Whisper: 1,500 positions, its decoder 448)
            self.max_encoder_len = (a.max_encoder_len
                                    or arch.max_encoder_length
                                    or _DEFAULT_MAX_LEN)
        elif arch.num_cross_attn_layers:  # a cross-attention decoder: room for its inputs
            self.max_encoder_len = (a.max_encoder_len
                                    or arch.default_max_encoder_len(a.max_images_per_request))
        elt = self.dtype.itemsize
        kv_heads = arch.num_kv_heads // self.tp.size  # this rank's heads' slice of the pools
        self_bytes = 2 * arch.num_self_attn_layers * kv_heads * arch.head_dim * elt
        cross_bytes = 2 * arch.num_cross_attn_layers * kv_heads * arch.head_dim * elt
        plan = plan_pools(
            budget_bytes=available_bytes(self.device, a.mem_fraction),
            self_bytes_per_token=self_bytes, cross_bytes_per_token=cross_bytes,
            max_running=a.max_running_requests, context_len=self.context_len,
            max_encoder_len=self.max_encoder_len, cross_fraction=a.cross_kv_fraction,
            max_total_tokens=a.max_total_tokens, max_cross_tokens=a.max_cross_tokens,
            page_size=a.page_size,
        )
        if self.tp.size > 1:  # the scheduler's books name the same slots on every rank
            plan = _agree(plan)
        ps = a.page_size
        self.req_to_token_pool = ReqToTokenPool(a.max_running_requests + 1, self.context_len,
                                                self.max_encoder_len, self.device)
        self.token_to_kv_pool = TokenToKVPool(
            max(1, plan.max_total_tokens // ps), ps, arch.num_self_attn_layers,
            kv_heads, arch.head_dim, self.dtype, self.device)
        self.cross_kv_pool = CrossKVPool(
            max(1, plan.max_cross_tokens // ps), ps, arch.num_cross_attn_layers,
            kv_heads, arch.head_dim, self.dtype, self.device,
        ) if arch.num_cross_attn_layers else None
        logger.info(
            "pools: %d decoder KV tokens, %d cross KV tokens, page size %d, %d request slots",
            self.token_to_kv_pool.capacity_tokens,
            0 if self.cross_kv_pool is None else self.cross_kv_pool.capacity_tokens,
            ps, self.req_to_token_pool.size,
        )

    def _warm_encoder(self) -> None:
        """Encode a 2-token source once, its cross K/V written to slots no request owns yet:
        the encoder's kernels compile now, not in the first request (1.0 s of its 1.6 s on an
        H100, mT5-large: benchmarks/profile_first_request.py)."""
        own = self.model.warm_encoder_input()  # a model's own input (Whisper)
        if own is not None:
            model_input, lens = own
            self.encode(EncodeBatch(token_ids=None, model_input=model_input, segment_lens=lens,
                                    cross_out_loc=torch.arange(sum(lens))))
        else:
            self.encode(EncodeBatch(token_ids=torch.tensor([3, 1]), model_input=None,
                                    segment_lens=[2], cross_out_loc=torch.arange(2)))
        torch.cuda.synchronize()

    @property
    def pools(self) -> dict:
        return {"req_to_token": self.req_to_token_pool, "token_to_kv": self.token_to_kv_pool,
                "cross_kv": self.cross_kv_pool}

    @torch.inference_mode()
    def encode(self, b: EncodeBatch) -> torch.Tensor | None:
        """Encode the new inputs and write every cross K/V of the batch; returns the encoder's
        new outputs (packed) or None when it only projected cached ones."""
        real = None
        if self.encode_buckets:  # (the padding's outputs written to the scratch slot, cut off)
            b, real = pad_encode_batch(b, self.args.max_encoder_batch_tokens)
        eb = to_encode_forward_batch(b, self.device, self.pools, self.attn_backend)
        self.attn_backend.init_forward_metadata(eb)
        new = self.model.encode(eb) if eb.has_new_inputs else None
        parts = [h for h in (new, eb.cached_hidden) if h is not None]
        self.model.store_cross_kv(torch.cat(parts) if len(parts) > 1 else parts[0], eb)
        return new if new is None or real is None else new[:real]

    @torch.inference_mode()
    def forward(self, b: DecoderBatch, defer: bool = False
                ) -> StepOutput | Callable[[], StepOutput]:
        """One decoder step: the forward, then the sampler. `defer`: queue the forward only and
        return the call that queues the sampler, for the host to finish filling `b.sampling`
        (the grammar masks) while the device runs the forward; until it is called nothing
        else may run on the model (a CUDA graph's logits live in its output buffer)."""
        # timing: the device reaches this event when done with the step before
        started = torch.cuda.Event(enable_timing=True) if self.device.startswith("cuda") else None
        if self.graph_runner is not None:
            if self.graph_runner.can_run(b):
                logits, greedy = self.graph_runner.replay(b, started)
                return self._then_sample(defer, logits, greedy, b, started)
            if self.graph_runner.can_run_prefill(b):
                rows, last = decode_rows(b)
                logits, greedy = self.graph_runner.replay(rows, started)
                scored = self._input_logprobs(b, lambda r: logits[r])  # a row per new token
                last = last.to(logits.device, non_blocking=True)
                return self._then_sample(defer, logits[last], greedy[last], b, started, scored)
        if started is not None:
            started.record()
        fb = to_forward_batch(b, self.device, self.pools, self.attn_backend)
        # record where each new token's K/V goes, once for the whole batch
        # (the output's length given: a repeat_interleave left to count it reads the device)
        rows = fb.req_pool_indices.repeat_interleave(fb.extend_lens.long(),
                                                     output_size=fb.positions.shape[0])
        self.req_to_token_pool.req_to_token[rows, fb.positions] = fb.out_cache_loc.int()
        self.attn_backend.init_forward_metadata(fb)
        hidden = self.model(fb.input_ids, fb.positions, fb)
        last = torch.cumsum(fb.extend_lens.long(), 0) - 1  # each request's last token
        scored = self._input_logprobs(b, lambda r: self.model.compute_logits(hidden[r]))
        logits = self.model.compute_logits(hidden[last])
        return self._then_sample(defer, logits, None, b, started, scored)

    def _then_sample(self, defer: bool, *args) -> StepOutput | Callable[[], StepOutput]:
        if not defer:
            return self._sample(*args)
        timed = self.device.startswith("cuda")
        forward_done = torch.cuda.Event(enable_timing=True) if timed else None
        if timed:
            forward_done.record()

        @torch.inference_mode()
        def sample() -> StepOutput:
            if not timed:
                return self._sample(*args)
            sampling = torch.cuda.Event(enable_timing=True)
            sampling.record()  # (the device waited for the host from forward_done to here)
            out = self._sample(*args)
            out.idle = (forward_done, sampling)
            return out
        return sample

    def _input_logprobs(self, b: DecoderBatch, logits_of) -> torch.Tensor | None:
        """The float32 log-probs of the batch's scored input tokens; `logits_of(rows)` gives
        the logits after the new tokens `rows`."""
        if b.input_logprobs is None:
            return None
        rows = b.input_logprobs.rows.to(self.device, non_blocking=True)
        targets = b.input_logprobs.targets.to(self.device, non_blocking=True)
        out = []
        for i in range(0, rows.numel(), _SCORED_ROWS_AT_ONCE):
            r, t = rows[i:i + _SCORED_ROWS_AT_ONCE], targets[i:i + _SCORED_ROWS_AT_ONCE]
            logprobs = torch.log_softmax(logits_of(r).float(), dim=-1)
            out.append(logprobs.gather(1, t[:, None]).squeeze(1))
        return torch.cat(out)

    def _sample(self, logits: torch.Tensor, greedy: torch.Tensor | None, b: DecoderBatch,
                started: torch.cuda.Event | None = None,
                input_logprobs: torch.Tensor | None = None) -> StepOutput:
        """b.sampling None means plain greedy for every request: the argmax is the answer."""
        if b.sampling is None:
            out = StepOutput(greedy if greedy is not None else self.sampler.greedy(logits))
        else:
            out = self.sampler(logits, b.sampling)
            if b.sampling.beam_moves is not None:  # the beams the device chose continue
                move_pages(self.req_to_token_pool.req_to_token, self.token_to_kv_pool,
                           b.sampling.beam_moves, out.beam_parents)
        out.logits, out.started, out.input_logprobs = logits, started, input_logprobs
        return out


def _agree(plan):
    """The pool sizes every tensor-parallel rank can hold: the smallest of the ranks' plans
    (their free memory differs a little)."""
    sizes = torch.tensor([plan.max_total_tokens, plan.max_cross_tokens], dtype=torch.int64)
    dist.all_reduce(sizes, op=dist.ReduceOp.MIN, group=parallel_state.tensor_parallel().cpu_group)
    return dataclasses.replace(plan, max_total_tokens=int(sizes[0]),
                               max_cross_tokens=int(sizes[1]))
