"""Every option of the runtime in one frozen dataclass, shared by the engine, the CLI and the server."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

DTYPES = ("auto", "float32", "bfloat16", "float16")
ATTENTION_BACKENDS = ("torch_batched", "torch_native", "triton")
QUANTIZATIONS = ("int8", "fp8")
GRAMMAR_BACKENDS = ("xgrammar", "llguidance")  # runtime/grammar/compiler.py: BACKENDS


@dataclass(frozen=True)
class RequestLimits:
    """Per-request limits of this deployment (ServerArgs); None: only the model's own."""

    max_prompt_tokens: int | None = None
    max_new_tokens: int | None = None
    max_n: int = 16
    max_images: int = 4  # in one prompt (the encoder's room is sized for it)
    max_images_total: int = 64  # in one request, all its prompts together
    max_batch_inputs: int = 1024  # rows: prompts x n x num_beams
    max_stop_chars: int = 1024  # all stop strings' characters together
    max_document_chars: int = 100_000  # one document of a translation request
    max_audio_bytes: int = 25 << 20  # one encoded audio file (speech models)
    max_audio_seconds: float = 600.0  # one transcription's audio (cut into 30 s windows)


@dataclass(frozen=True)
class CacheIsolation:
    """Whose cached entries a request may reuse (ServerArgs' cache_isolation options): the
    caches' rule, and the data-parallel router's, which must not reveal more than they do."""

    mode: str = "user"  # none, user or shared
    public_min_users: int = 3
    window_seconds: float = 600.0


@dataclass(frozen=True)
class ServerArgs:
    model_path: str | None = None  # local HF checkpoint directory (unset: the bundled demo model)
    tokenizer_path: str | None = None  # tokenizer directory (unset: the model directory)
    load_format: str = "safetensors"  # safetensors, or dummy (random weights of the shapes)
    device: str | None = None  # cpu, cuda or cuda:N (unset: cuda when present, else cpu)
    tp_size: int = 1  # tensor-parallel ranks: a process and a GPU each (CPU: processes, gloo)
    dist_init_port: int | None = None  # tp_size > 1: ranks' rendezvous port (unset: any free one)
    dtype: str = "auto"  # float32, bfloat16, float16, auto (CPU: float32; GPU: bfloat16 if it can, no float16 for T5)
    quantization: str | None = None  # int8 (weight-only; CPU, GPU) or fp8 (E4M3; sm_89+ GPUs)
    quantize_lm_head: bool = False  # with quantization: the LM head too (else the model dtype)
    int8_activations: bool = False  # CPU, int8: activations too, per token (as CTranslate2)
    attention_backend: str | None = None  # unset: triton on CUDA, torch_batched on CPU
    page_size: int = 16  # decoder and encoder tokens per KV page
    mem_fraction: float = 0.85  # share of free device memory for weights + pools
    dp_size: int = 1  # data-parallel replicas: schedulers with their own GPUs, pools and caches
    cross_kv_fraction: float | None = None  # pool budget share for cross K/V (unset: by size)
    max_total_tokens: int | None = None  # decoder KV pool size in tokens (unset: from the budget)
    max_cross_tokens: int | None = None  # cross K/V pool size in tokens (unset: from the budget)
    max_running_requests: int = 256  # requests decoding at once (more wait in the queue)
    max_prefill_tokens: int = 16384  # decoder tokens admitted by one extend batch
    chunked_prefill_size: int | None = None  # tokens per prefill chunk of long prompts (unset: off)
    max_encoder_batch_tokens: int = 16384  # encoder inputs' tokens per encoder pass
    context_length: int | None = None  # longest decoder sequence (unset: the model's, else 2048)
    max_encoder_len: int | None = None  # longest encoder input (unset: the model's, else 2048)
    random_seed: int = 0  # seeds weights of --load-format dummy and unseeded sampling
    debug_checks: bool = False  # check pool integrity whenever the scheduler goes idle
    gc_full_pass_interval: float = 600.0  # full GC passes: when idle, else every N s (0: Python's)
    disable_cuda_graph: bool = False  # run decode steps eagerly instead of replaying CUDA graphs
    disable_overlap_schedule: bool = False  # stop preparing step N+1 on the host while N runs
    cuda_graph_max_bs: int = 512  # largest decode batch captured (at most max_running_requests)
    cuda_graph_max_prefill_tokens: int = 32  # shorter prefills replay decode graphs (0: never)
    compile_encoder: bool = False  # torch.compile Florence-2's image tower at start (~1 min)
    grammar_backend: str = "xgrammar"  # constrained decoding's matchers: xgrammar or llguidance
    # caches
    disable_radix_cache: bool = False  # turn off decoder prefix reuse
    disable_encoder_cache: bool = False  # turn off encoder output (cross K/V) reuse
    cache_isolation: str = "user"  # user (no sharing across users), shared (public after K) or none
    cache_public_min_users: int = 3  # shared isolation: distinct users who make an entry public
    cache_window_seconds: float = 600.0  # shared isolation: the window those users are counted in
    host_cache_gb: float = 0.0  # host-memory tier for evicted decoder KV and cross K/V (0: off)
    encoder_hidden_cache_mb: int = 256  # warm tier: encoder hidden states kept after eviction
    log_level: str = "warning"  # debug, info, warning, error
    # request limits (each exceeded limit is a 4xx naming it)
    max_request_bytes: int = 32 << 20  # largest HTTP request body in bytes
    max_prompt_tokens: int | None = None  # longest prompt / encoder input (unset: the model's)
    max_new_tokens_limit: int | None = None  # largest max_tokens accepted (unset: the context)
    max_n: int = 16  # largest n (samples per prompt)
    max_batch_inputs: int = 1024  # most rows (prompts x n x num_beams) in one request
    max_stop_chars: int = 1024  # most characters of a request's stop strings, all together
    max_document_chars: int = 100_000  # longest document to translate, in characters
    glossary: str | None = None  # named translation glossaries: NAME=path.json[,NAME2=path2.json]
    # connections (HTTP server)
    max_connections: int = 2048  # open connections (or requests) at once; beyond: a 503
    api_server_count: int = 1  # HTTP processes sharing the port (the HTTP work spread over cores)
    header_timeout: float = 10.0  # seconds a client has to send a request's headers
    timeout_keep_alive: int = 5  # seconds an idle keep-alive connection stays open
    shutdown_grace: float = 30.0  # on SIGTERM: seconds running requests get to finish (503 to new)
    # images (vision models)
    max_images_per_request: int = 4  # most images in one prompt (sizes the cross-attention room)
    max_images_per_call: int = 64  # most images in one request body, all its prompts together
    max_image_pixels: int = 40_000_000  # largest width * height of one image
    allow_remote_media: bool = False  # fetch http(s) image URLs (size-capped, with a timeout)
    allowed_local_media_path: str | None = None  # server: read image file paths under this dir
    media_processes: int = 0  # decode and preprocess images in N worker processes (0: threads)
    # audio (speech models: Whisper)
    max_audio_bytes: int = 26_214_400  # largest encoded audio file (25 MiB, OpenAI's limit)
    max_audio_seconds: float = 600.0  # longest audio to transcribe (cut into 30 s windows)
    # HTTP server
    host: str = "127.0.0.1"  # address the HTTP server binds
    port: int = 30000  # HTTP port
    api_key: str | None = None  # when set, every endpoint but /health needs "Bearer KEY"
    admin_api_key: str | None = None  # when set, /flush_cache, /metrics, /debug/* need this key
    served_model_name: str | None = None  # model name in the API (unset: the directory's name)
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS}, "
                             f"got {self.quantization!r}")
        if self.int8_activations and self.quantization != "int8":
            raise ValueError("int8_activations needs quantization='int8' (it quantizes the "
                             f"activations of int8 weights' products), got {self.quantization!r}")
        if self.grammar_backend not in GRAMMAR_BACKENDS:
            raise ValueError(f"grammar_backend must be one of {GRAMMAR_BACKENDS}, "
                             f"got {self.grammar_backend!r}")
        if self.attention_backend is not None and self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend must be one of {ATTENTION_BACKENDS}, got {self.attention_backend!r}"
            )
        if self.device is not None and self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")
        _positive = ("tp_size", "dp_size", "page_size", "max_running_requests",
                     "max_prefill_tokens", "port",
                     "max_encoder_batch_tokens", "cuda_graph_max_bs",
                     "max_images_per_request", "max_image_pixels", "max_request_bytes",
                     "max_audio_bytes",
                     "max_n", "max_batch_inputs", "max_stop_chars", "max_document_chars",
                     "max_connections", "api_server_count",
                     "timeout_keep_alive")
        for name in _positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if (not isinstance(self.media_processes, int) or isinstance(self.media_processes, bool)
                or self.media_processes < 0):
            raise ValueError(f"media_processes must be 0 (media threads) or a positive number "
                             f"of worker processes, got {self.media_processes!r}")
        for name in ("max_total_tokens", "max_cross_tokens", "context_length", "max_encoder_len",
                     "max_prompt_tokens", "max_new_tokens_limit", "chunked_prefill_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
        if not (isinstance(self.max_audio_seconds, (int, float)) and self.max_audio_seconds > 0):
            raise ValueError(f"max_audio_seconds must be a positive number of seconds, "
                             f"got {self.max_audio_seconds!r}")
        if not (isinstance(self.header_timeout, (int, float)) and self.header_timeout > 0):
            raise ValueError(f"header_timeout must be a positive number of seconds, "
                             f"got {self.header_timeout!r}")
        if not (isinstance(self.shutdown_grace, (int, float)) and self.shutdown_grace >= 0):
            raise ValueError(f"shutdown_grace must be a non-negative number of seconds, "
                             f"got {self.shutdown_grace!r}")
        if self.dp_size > 1 and self.device is not None and self.device.startswith("cuda:"):
            raise ValueError(f"device {self.device!r} pins one GPU, but dp_size {self.dp_size} "
                             f"replicas each take their own: use device 'cuda' and choose the "
                             f"GPUs with CUDA_VISIBLE_DEVICES")
        port = self.dist_init_port
        if port is not None and (not isinstance(port, int) or isinstance(port, bool)
                                 or not 1 <= port <= 65535 - (self.dp_size - 1)):
            raise ValueError(f"dist_init_port must be a TCP port (1-65535, leaving room for one "
                             f"port per data-parallel replica), got {port!r}")
        if self.admin_api_key is not None and self.admin_api_key == self.api_key:
            raise ValueError("admin_api_key must differ from api_key: the admin scope would "
                             "be anyone's")
        if not 0.0 < self.mem_fraction <= 1.0:
            raise ValueError(f"mem_fraction must be in (0, 1], got {self.mem_fraction!r}")
        if self.cache_isolation not in ("none", "user", "shared"):
            raise ValueError(f"cache_isolation must be 'none', 'user' or 'shared', "
                             f"got {self.cache_isolation!r}")
        k = self.cache_public_min_users
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 64:
            raise ValueError(f"cache_public_min_users must be an integer in [1, 64], got {k!r}")
        for name, least in (("cache_window_seconds", 1e-9), ("host_cache_gb", 0.0),
                            ("gc_full_pass_interval", 0.0)):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < least:
                raise ValueError(f"{name} must be a {'positive' if least else 'non-negative'} "
                                 f"number, got {value!r}")
        for name in ("encoder_hidden_cache_mb", "cuda_graph_max_prefill_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if self.cross_kv_fraction is not None and not 0.0 < self.cross_kv_fraction < 1.0:
            raise ValueError(f"cross_kv_fraction must be in (0, 1), got {self.cross_kv_fraction!r}")

    @classmethod
    def field_help(cls) -> dict[str, str]:
        """Each field's trailing comment above: the one description the CLI's --help, the
        README's flag table and this file share."""
        import inspect
        import re

        found = {}
        for line in inspect.getsource(cls).splitlines():
            m = re.match(r"\s{4}(\w+): [^#]*#\s*(.+)$", line)
            if m:
                found[m.group(1)] = m.group(2).strip()
        return found

    @classmethod
    def from_kwargs(cls, **kwargs) -> ServerArgs:
        """Build from keyword arguments, naming any that is not an option."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise ValueError(f"unknown engine option(s): {', '.join(unknown)}")
        return cls(**kwargs)

    def request_limits(self) -> RequestLimits:
        return RequestLimits(max_prompt_tokens=self.max_prompt_tokens,
                             max_new_tokens=self.max_new_tokens_limit, max_n=self.max_n,
                             max_images=self.max_images_per_request,
                             max_images_total=self.max_images_per_call,
                             max_batch_inputs=self.max_batch_inputs,
                             max_stop_chars=self.max_stop_chars,
                             max_document_chars=self.max_document_chars,
                             max_audio_bytes=self.max_audio_bytes,
                             max_audio_seconds=self.max_audio_seconds)

    def isolation(self) -> CacheIsolation:
        return CacheIsolation(self.cache_isolation, self.cache_public_min_users,
                              self.cache_window_seconds)

    def resolved_device(self) -> str:
        import torch

        device = self.device
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda"):
            if not torch.cuda.is_available():
                raise ValueError(f"device {device!r} requested but CUDA is not available")
            if device == "cuda":  # pin an index: pools and memory queries need one
                device = f"cuda:{torch.cuda.current_device()}"
        return device

    def resolved_attention_backend(self, device: str) -> str:
        if self.attention_backend is not None:
            return self.attention_backend
        return "triton" if device.startswith("cuda") else "torch_batched"
