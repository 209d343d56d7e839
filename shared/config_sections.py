"""The configuration's sections: each field declared once, in the section of what it configures.

`ServeConfig` (config.py) is every section at once, flat, so that each field keeps its one flag and
its one `PAGEDSERVE_*` variable. A part that needs one concern takes its section whole
(`config.section(RouterSection)`): a frozen copy, typed, holding only that section's fields.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from pagedserve.shared.speculative_config import SpeculativeConfig, parse_speculative_config


def parse_bytes(value: object) -> int | str:
    """`auto`, an int, or a size such as `512MiB`, `4GiB`, `2G` (powers of 1024) -> int bytes or `auto`."""
    if isinstance(value, bool):
        raise ValueError(f"kv_cache_memory must be 'auto' or a size in bytes, got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"kv_cache_memory must be at least 1 byte, got {value}")
        return value
    text = str(value).strip()
    if text.lower() == "auto":
        return "auto"
    units = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20}
    units |= {"g": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40}
    number = text.rstrip("bBiIkKmMgGtT ")
    unit = text[len(number) :].strip().lower()
    try:
        amount = float(number)
    except ValueError:
        amount = -1.0
    if unit not in units or amount <= 0:
        raise ValueError(
            f"kv_cache_memory must be 'auto', a number of bytes or a size like 512MiB / 4GiB; got {value!r}"
        )
    return max(1, int(amount * units[unit]))


def _power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


class Section(BaseModel):
    """A group of fields; read-only once made (a section handed to a part never changes under it)."""

    # The settings' dict type (a ConfigDict with more keys), so that ServeConfig inherits one type from
    # its sections and BaseSettings: the narrowing BaseSettings itself makes of BaseModel's.
    model_config: ClassVar[SettingsConfigDict] = SettingsConfigDict(extra="forbid", frozen=True)  # pyright: ignore[reportIncompatibleVariableOverride]


class ModelSection(Section):
    """The model and how a worker runs it: checkpoint, dtype, kernels, threads, tensor parallelism."""

    model: str = Field(
        "smollm2-135m",
        description="checkpoint folder, .gguf file (or a folder holding one), or the bundled name 'smollm2-135m'",
    )
    tokenizer: str | None = Field(None, description="a folder whose tokenizer replaces the model's own")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "float32", description="weights and activations; auto = the one measured faster on this CPU"
    )
    device: str = Field("cpu", description="torch device of the worker: cpu or cuda[:N]")
    attention_backend: Literal["auto", "torch", "cpp", "triton"] = Field(
        "auto", description="auto = triton on CUDA, the C++ kernel on the CPU (torch if it cannot build)"
    )
    prepack_weights: bool = Field(
        True,
        description="pack linear weights once for oneDNN on the CPU (float32; bfloat16 where oneDNN runs it)",
    )
    # auto by default: on a float32 CPU worker the bundled Q4_1 model runs as fast as its float32 load at
    # 64 requests and ~2x as fast at 4, within float rounding of it (docs/cpu-performance.md, "Quantized
    # weights"); in bfloat16 or on a GPU it loads dense, saying why.
    quantization: Literal["auto", "none", "gguf", "gptq", "awq", "compressed-tensors"] = Field(
        "auto",
        description="auto = keep a quantized checkpoint quantized where this worker can run it (the CPU, "
        "float32), else dequantize to --dtype; gguf = keep a GGUF checkpoint's weights in their stored "
        "types (every common one: F16, BF16, Q4_0 to Q8_0, the K-quants, IQ4_NL/XS), refused where it "
        "cannot; gptq/awq/compressed-tensors = keep such a checkpoint's int4/int8 linears quantized, "
        "repacked to Q4_0/Q4_1/Q8_0 (refused where any cannot be); none = dequantize to --dtype",
    )
    # None, not float32: LLM(...) takes no PAGEDSERVE_* variable for its fields, but this choice was the
    # variable alone before it was a field, and in-process tools (bench speculative, the microbenchmarks)
    # are run with it set; the loader reads it where nothing was configured.
    quant_activations: Literal["float32", "int8"] | None = Field(
        None,
        description="how linears over quantized weights take their activations: float32 (the default) = "
        "within float rounding of the dequantized weights; int8 = each 32-block of a row to int8 and integer "
        "dot products, as llama.cpp does (faster at 1-512 rows, with llama.cpp's rounding: greedy tokens "
        "drift from the float32 reference as its do; docs/cpu-performance.md)",
    )
    num_threads: int | None = Field(None, ge=1, description="torch intra-op threads of a CPU worker")
    worker_id: str | None = Field(None, max_length=64, description="this worker's name; default host-pid")
    simulate_step_ms: float | None = Field(
        None, gt=0.0, le=60_000.0, description="worker runs no model: each step sleeps this long, fake tokens"
    )
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        le=64,
        description="processes one worker's model is split over (its heads and MLP columns; gloo on the CPU, "
        "NCCL on GPUs); rank 0 speaks for the group, which lives and dies as one (docs/tensor-parallel.md)",
    )


class LoraSection(Section):
    """LoRA adapters (docs/lora.md): 0 slots = off, and the projections stay unwrapped."""

    max_loras: int = Field(
        0, ge=0, le=64, description="LoRA adapter slots per worker = most adapters per step; 0 = LoRA off"
    )
    max_lora_rank: int = Field(64, ge=1, le=512, description="largest LoRA rank accepted")
    max_cpu_loras: int = Field(
        16, ge=1, le=1024, description="parsed LoRA adapters a worker keeps cached (LRU)"
    )
    lora_modules: list[str] = Field(
        default_factory=list, description="LoRA adapters served from the start: name=path ..."
    )
    lora_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="the adapters' weights in their slots: auto = the model's dtype; bfloat16 / float16 under a "
        "float32 model halve the bytes every step reads (sums stay float32; exact for adapters stored so)",
    )


class CacheSection(Section):
    """The paged KV cache: block size, how much memory, prefix caching, storage, persistence."""

    block_size: int = Field(16, description="tokens per KV block: a power of two, 8 to 128")
    num_blocks: int | None = Field(None, ge=1, description="KV blocks per worker (overrides kv_cache_memory)")
    kv_cache_memory: int | Literal["auto"] = Field(
        "auto",
        description="KV cache per worker on the CPU: bytes, a size (512MiB, 4GiB), or auto = kv_cache_share of "
        "the memory free after the weights (cgroup limits respected), split among workers_per_machine",
    )
    kv_cache_share: float = Field(
        0.5, gt=0.0, le=0.95, description="with kv_cache_memory auto: the share of available memory for KV"
    )
    workers_per_machine: int = Field(
        1, ge=1, le=4096, description="workers sharing this machine's memory (`pagedserve up` sets --workers)"
    )
    gpu_memory_utilization: float = Field(
        0.85, gt=0.0, le=1.0, description="fraction of free GPU memory for KV"
    )
    enable_prefix_caching: bool = Field(True, description="reuse full KV blocks of identical prefixes")
    kv_cache_dtype: Literal["auto", "float32", "bfloat16", "float16", "int8"] = Field(
        "auto",
        description="K/V storage: auto = the model's dtype; int8 = a quarter of float32's bytes, a scale per "
        "slot and head (CPU; docs/kv-int8.md); bfloat16 under a float32 model = half its bytes (CPU); any "
        "other float dtype than the model's is refused",
    )
    kv_persist: bool = Field(
        True,
        description="`pagedserve up` keeps each CPU worker's KV pool in a shared-memory segment it owns, so a "
        "restarted worker continues its pool and its requests resume without recompute",
    )
    kv_segment_dir: str | None = Field(
        None, description="folder of the workers' KV segments (set by `pagedserve up`); None = private memory"
    )
    kv_resume_timeout_s: float = Field(
        10.0,
        gt=0.0,
        description="a lost worker whose pool is in shared memory has this long to come back and resume its "
        "requests before they recompute on another worker",
    )

    @field_validator("kv_cache_memory", mode="before")
    @classmethod
    def _kv_cache_memory_is_a_size(cls, v: Any) -> int | str:
        return parse_bytes(v)

    @field_validator("block_size")
    @classmethod
    def _block_size_is_power_of_two(cls, v: int) -> int:
        if not (8 <= v <= 128 and _power_of_two(v)):
            raise ValueError(f"block_size must be a power of two from 8 to 128, got {v}")
        return v


class SchedulerSection(Section):
    """What bounds the scheduler: batch and token budgets, queueing, timeouts, speculation."""

    max_num_seqs: int = Field(64, ge=1, le=4096, description="requests running at once per worker")
    max_num_batched_tokens: int = Field(
        2048, ge=1, le=1 << 20, description="tokens per step (chunked prefill)"
    )
    max_model_len: int | None = Field(None, ge=1, description="longest prompt + output; default: the model's")
    aging_s: float = Field(
        5.0, ge=0.0, description="a request waiting longer than this moves ahead of newer ones"
    )
    pipeline_depth: int = Field(2, ge=1, le=3, description="steps in flight per worker (1, 2 or 3)")
    request_timeout_s: float = Field(
        600.0, gt=0.0, description="a request still unfinished after this ends in error"
    )
    max_inflight_per_client: int = Field(256, ge=1, description="requests one client may have live at once")
    max_waiting_requests: int = Field(
        4096,
        ge=1,
        le=1 << 20,
        description="requests waiting for a worker; past it a new one is refused overloaded",
    )
    finished_results_kept: int = Field(
        10_000,
        ge=0,
        le=1 << 22,
        description="results of finished requests kept, newest first, so a retry by request id is a lookup",
    )
    speculative_config: SpeculativeConfig | None = Field(
        None, description='JSON in vLLM\'s shape, e.g. \'{"method": "ngram", "num_speculative_tokens": 4}\''
    )

    @field_validator("speculative_config", mode="before")
    @classmethod
    def _speculative_config_from_json(cls, v: Any) -> Any:
        return parse_speculative_config(v)


class ReliabilitySection(Section):
    """Leases and liveness: how soon a silent worker, client or block manager counts as lost."""

    lease_ttl_s: float = Field(
        10.0, gt=0.0, description="a request's blocks are reclaimed this long after the last renewal"
    )
    lease_renew_interval_s: float = Field(
        2.0, gt=0.0, description="how often the scheduler renews its live leases"
    )
    reap_interval_s: float = Field(
        1.0, gt=0.0, description="how often the block manager reaps expired leases"
    )
    heartbeat_interval_s: float = Field(0.5, gt=0.0, description="worker and client heartbeat period")
    worker_timeout_s: float = Field(1.5, gt=0.0, description="a worker silent this long is declared lost")
    client_timeout_s: float = Field(
        10.0, gt=0.0, description="a client silent this long has its requests aborted"
    )
    rpc_timeout_s: float = Field(
        2.0, gt=0.0, description="a block-manager reply later than this marks it down"
    )
    step_timeout_s: float = Field(
        60.0,
        gt=0.0,
        description="the most a step may go unanswered before its worker is lost; the timeout in force "
        "is max(step_timeout_floor_s, step_timeout_factor x p99 of that worker's recent steps), capped here",
    )
    step_timeout_floor_s: float = Field(
        10.0, gt=0.0, description="the least a step timeout measured from step times may be"
    )
    step_timeout_factor: float = Field(
        20.0, ge=1.0, description="a step unanswered for this many times the worker's p99 step time is lost"
    )

    @model_validator(mode="after")
    def _intervals_fit(self) -> Self:
        if self.lease_renew_interval_s >= self.lease_ttl_s:
            raise ValueError(
                f"lease_renew_interval_s ({self.lease_renew_interval_s}) must be shorter than "
                f"lease_ttl_s ({self.lease_ttl_s}), or live leases expire between renewals"
            )
        if self.heartbeat_interval_s >= self.worker_timeout_s:
            raise ValueError(
                f"heartbeat_interval_s ({self.heartbeat_interval_s}) must be shorter than "
                f"worker_timeout_s ({self.worker_timeout_s})"
            )
        return self


class DeploymentSection(Section):
    """What `pagedserve up`'s supervisor keeps ready: standby processes."""

    standby_api: int = Field(
        1,
        ge=0,
        le=1,
        description="`pagedserve up` keeps this many API processes built (imports, tokenizer, template) and "
        "waiting, to take a dead API process's place at once instead of starting one",
    )
    standby_workers: int = Field(
        1,
        ge=0,
        le=1,
        description="`pagedserve up` keeps this many workers loaded and nameless, to take a dead worker's place "
        "at once (its model already loaded) instead of starting a process",
    )


class EndpointsSection(Section):
    """Where the services listen: ZeroMQ endpoints, ops HTTP ports, the largest frame."""

    front_endpoint: str = Field("tcp://127.0.0.1:5555", description="scheduler ROUTER for clients")
    worker_endpoint: str = Field("tcp://127.0.0.1:5556", description="scheduler ROUTER for workers")
    block_manager_endpoint: str = Field("tcp://127.0.0.1:5557", description="block-manager ROUTER")
    ops_host: str = Field("127.0.0.1", description="address the ops HTTP servers bind")
    scheduler_ops_port: int = Field(8080, ge=0, le=65535, description="scheduler ops HTTP port (0 = off)")
    block_manager_ops_port: int = Field(
        8081, ge=0, le=65535, description="block-manager ops HTTP port (0 = off)"
    )
    max_message_bytes: int = Field(64 * 1024**2, ge=1024, description="largest frame any socket accepts")


class ApiSection(Section):
    """The OpenAI-compatible HTTP API (services/api): address, keys, parsers, what it serves."""

    api_host: str = Field("127.0.0.1", description="address the OpenAI-compatible API binds")
    api_port: int = Field(8000, ge=1, le=65535, description="port of the OpenAI-compatible API")
    api_processes: int = Field(
        1,
        ge=1,
        le=64,
        description="API processes sharing api_port (SO_REUSEPORT), each its own SDK client: one's death "
        "ends only its own streams",
    )
    api_keep_alive_s: float = Field(
        75.0,
        gt=0,
        le=3600,
        description="how long the API keeps an idle HTTP connection open; longer than clients' pool expiry "
        "(httpx/openai 5 s), so a client never sends on a connection the server is closing",
    )
    api_key: str | None = Field(None, description="if set, /v1 requires `Authorization: Bearer <api_key>`")
    api_keys_file: str | None = Field(
        None,
        description="TOML or JSON file of name = key: /v1 requires one of the keys, and its name is the "
        "request's user for the per-user limits (instead of api_key)",
    )
    served_model_name: str | None = Field(
        None, max_length=256, description="model name the API answers to; default: the model folder's name"
    )
    tool_call_parser: str = Field(
        "hermes",
        description="how tool calls are read from free text (tool_choice auto): hermes (<tool_call> tags)",
    )
    reasoning_parser: Literal["qwen3", "deepseek_r1"] | None = Field(
        None,
        description="move <think>...</think> out of the answer into reasoning_content; structured outputs "
        "and tool calls then apply to the answer after it (None = the output is all answer)",
    )
    runner: Literal["auto", "generate", "embed", "rerank"] = Field(
        "auto",
        description="what the API serves: generate (completions, chat, responses, messages); embed "
        "(/v1/embeddings, and /v1/score, /v1/rerank by cosine similarity) from pooled hidden states; "
        "rerank (/v1/score, /v1/rerank from a Qwen3-Reranker-style model's yes/no logits); auto = embed "
        "when the checkpoint has a sentence-transformers Pooling module (modules.json), else generate",
    )
    pooling: Literal["auto", "last", "mean", "cls"] = Field(
        "auto",
        description="embed: how a prompt's hidden states become one vector; auto = 1_Pooling's, else last",
    )
    normalize_embeddings: bool | None = Field(
        None,
        description="embed: L2-normalise embeddings; default: when modules.json has a Normalize module "
        "(or none at all)",
    )
    responses_kept: int = Field(
        1000,
        ge=0,
        le=1 << 20,
        description="Responses API: responses kept per API process for previous_response_id",
    )

    @model_validator(mode="after")
    def _one_kind_of_key(self) -> Self:
        if self.api_key is not None and self.api_keys_file is not None:
            raise ValueError("set api_key or api_keys_file, not both: a key without a name has no user")
        return self


class RouterSection(Section):
    """`pagedserve router`: several schedulers (shards) behind one front endpoint (services/router)."""

    router_shards: list[str] = Field(
        default_factory=list,
        description="the router's shards: each scheduler's front endpoint (the router binds front_endpoint)",
    )
    router_policy: Literal["cache_aware", "round_robin", "least_load"] = Field(
        "cache_aware", description="how the router places a new request on a shard"
    )
    router_cache_threshold: float = Field(
        0.3, ge=0.0, le=1.0, description="least share of a prompt's leading blocks a shard must have seen"
    )
    router_balance_abs: int = Field(
        4096, ge=0, description="outstanding tokens between shards past which the least loaded one is chosen"
    )
    router_balance_rel: float = Field(
        1.5, ge=1.0, description="... and past this ratio of the most to the least loaded shard"
    )
    router_shard_timeout_s: float = Field(
        3.0, gt=0.0, description="a shard silent this long is lost: its requests start over on the others"
    )
    router_ops_port: int = Field(8090, ge=0, le=65535, description="router ops HTTP port (0 = off)")
    router_shard_ops: list[str] = Field(
        default_factory=list,
        description="each shard scheduler's ops URL, in router_shards' order: LoRA admin reaches them all",
    )


class SecuritySection(Section):
    """CURVE keys for the sockets and the ops endpoints' admin token."""

    curve_keys_dir: str | None = Field(
        None, description="folder of CURVE keys from `pagedserve keys`; None = off"
    )
    admin_token: str | None = Field(None, description="token required by admin actions on the ops endpoints")


class LoggingSection(Section):
    """How a process logs."""

    log_format: Literal["auto", "json", "pretty"] = Field("auto", description="auto = pretty on a terminal")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="lowest level logged")
