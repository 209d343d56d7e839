"""Prometheus metrics of the scheduler (served on /metrics by the ops endpoint)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class SchedulerMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.waiting = Gauge("pagedserve_requests_waiting", "requests waiting for a worker", registry=r)
        self.running = Gauge("pagedserve_requests_running", "requests holding KV blocks", registry=r)
        self.workers = Gauge("pagedserve_workers_live", "workers taking steps", registry=r)
        self.ttft = Histogram(
            "pagedserve_time_to_first_token_seconds", "arrival to first token", buckets=_LATENCY, registry=r
        )
        self.itl = Histogram(
            "pagedserve_inter_token_seconds", "between tokens of one completion", buckets=_LATENCY, registry=r
        )
        self.e2e = Histogram("pagedserve_request_seconds", "arrival to finish", buckets=_LATENCY, registry=r)
        self.tokens = Counter("pagedserve_tokens", "tokens processed", ["kind"], registry=r)
        self.preemptions = Counter("pagedserve_preemptions", "requests preempted for recompute", registry=r)
        self.finished = Counter("pagedserve_requests_finished", "requests ended", ["reason"], registry=r)
        self.rejected = Counter("pagedserve_requests_rejected", "bad input refused", ["code"], registry=r)
        self.step_time = Histogram(
            "pagedserve_step_seconds", "worker step wall time", buckets=_LATENCY, registry=r
        )
        self.worker_idle = Counter(
            "pagedserve_worker_idle_seconds", "worker time between steps", ["worker_id"], registry=r
        )
        self.worker_busy = Counter(
            "pagedserve_worker_busy_seconds", "worker time in steps", ["worker_id"], registry=r
        )
        self.workers_lost = Counter("pagedserve_workers_lost", "workers declared dead", registry=r)
        self.stale_results = Counter(
            "pagedserve_stale_step_results",
            "step results fenced off: from before the worker's reset",
            registry=r,
        )
        self.step_timeouts = Counter(
            "pagedserve_step_timeouts", "workers lost because a step went unanswered", registry=r
        )
        self.worker_restarts = Counter(
            "pagedserve_worker_restarts", "workers back under a new incarnation (same name)", registry=r
        )
        self.max_waiting = Gauge(
            "pagedserve_max_waiting_requests", "admission bound: past it requests get 429", registry=r
        )
        self.spec_proposed = Counter(
            "pagedserve_spec_proposed_tokens", "tokens proposed by speculative decoding", registry=r
        )
        self.spec_accepted = Counter(
            "pagedserve_spec_accepted_tokens", "proposed tokens the target accepted", registry=r
        )
        self.spec_decodes = Counter(
            "pagedserve_spec_decodes", "decodes granted lookahead for proposed tokens", registry=r
        )
        self.spec_row_cost = Gauge(
            "pagedserve_spec_row_cost",
            "what one more decode row adds to a step, as a share of a one-row step (speculation's price)",
            registry=r,
        )
        self.bm_outages = Counter("pagedserve_block_manager_outages", "block manager unreachable", registry=r)
        self.lora_adapters_per_step = Histogram(
            "pagedserve_lora_adapters_per_step",
            "distinct LoRA adapters in one worker step (LoRA on)",
            buckets=(0, 1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )
        self.lora_worker_loads = Counter(
            "pagedserve_lora_worker_loads", "LoRA adapters a worker read from disk inside a step", registry=r
        )
        self.lora_worker_load_s = Counter(
            "pagedserve_lora_worker_load_seconds", "step time spent reading LoRA adapters", registry=r
        )
        self.lora_admin = Counter(
            "pagedserve_lora_admin", "LoRA load/unload calls by outcome", ["action", "outcome"], registry=r
        )
        self.lora_loaded = Gauge(
            "pagedserve_lora_adapters_loaded", "LoRA adapters requests may name", registry=r
        )
        self.resumed = Counter(
            "pagedserve_requests_resumed",
            "requests that continued on a restarted worker's pool, nothing computed again",
            registry=r,
        )
        self.recomputed = Counter(
            "pagedserve_prefill_recomputed_tokens",
            "committed KV tokens computed again because their worker was lost (0 while pools continue)",
            registry=r,
        )
        self.suspended = Gauge(
            "pagedserve_workers_suspended",
            "lost workers whose requests wait for their pool to come back",
            registry=r,
        )
