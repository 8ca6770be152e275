"""Prometheus metrics of one server (its own registry, so several can live in one process).

With several HTTP processes (`--api-server-count`) the main process sets
PROMETHEUS_MULTIPROC_DIR for them: prometheus_client then keeps every process's values in
files there, and `render` adds up the counters and histograms of all of them; the gauges
(the scheduler's figures, set from its stats when /metrics is asked) are the latest set.
"""

from __future__ import annotations

import functools
import os

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client import Gauge as _Gauge
from prometheus_client.multiprocess import MultiProcessCollector

# several processes: a gauge's value is the one set last, by whichever process asked
Gauge = functools.partial(_Gauge, multiprocess_mode="mostrecent")

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class ServerMetrics:
    def __init__(self, replicas: int = 1) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("seq2serve_requests", "Requests by endpoint and status code",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("seq2serve_prompt_tokens", "Prompt tokens processed",
                                     registry=r)
        self.generated_tokens = Counter("seq2serve_generation_tokens", "Tokens generated",
                                        registry=r)
        self.ttft = Histogram("seq2serve_time_to_first_token_seconds", "Time to first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("seq2serve_inter_token_latency_seconds",
                             "Time between consecutive tokens", buckets=_LATENCY_BUCKETS,
                             registry=r)
        self.e2e = Histogram("seq2serve_e2e_request_latency_seconds", "Request latency",
                             buckets=_LATENCY_BUCKETS, registry=r)
        # the scheduler's figures: with data parallelism one series per replica ("replica")
        self.replicas = replicas
        rl = ["replica"] if replicas > 1 else []
        self.running = Gauge("seq2serve_num_running_reqs", "Requests decoding", rl, registry=r)
        self.waiting = Gauge("seq2serve_num_waiting_reqs", "Requests queued", rl, registry=r)
        self.kv_usage = Gauge("seq2serve_kv_cache_usage", "Share of decoder KV slots in use",
                              rl, registry=r)
        self.cross_usage = Gauge("seq2serve_cross_kv_cache_usage",
                                 "Share of cross-attention KV slots in use", rl, registry=r)
        self.encoder_hit_rate = Gauge("seq2serve_encoder_cache_hit_rate",
                                      "Encoder inputs served from the encoder cache", rl,
                                      registry=r)
        self.encoder_entries = Gauge("seq2serve_encoder_cache_entries",
                                     "Encoder outputs cached (either tier)", rl, registry=r)
        self.encoder_hot_tokens = Gauge("seq2serve_encoder_cache_hot_tokens",
                                        "Cross K/V tokens held by the encoder cache", rl,
                                        registry=r)
        self.encoder_hidden_bytes = Gauge("seq2serve_encoder_cache_hidden_bytes",
                                          "Encoder hidden states kept (warm tier)", rl,
                                          registry=r)
        # cumulative counts of the scheduler's, hence gauges: the encoder's work (a cache hit
        # runs no input; a document's repeated sentences are sent once)
        self.encoder_inputs = Gauge("seq2serve_encoder_inputs", "Encoder inputs run through "
                                    "the encoder, since start", rl, registry=r)
        self.encoder_forwards = Gauge("seq2serve_encoder_forwards", "Encoder passes (batches "
                                      "of inputs), since start", rl, registry=r)
        self.prefix_hit_rate = Gauge("seq2serve_prefix_cache_hit_rate",
                                     "Decoder prompt tokens served from the radix cache",
                                     rl, registry=r)
        self.prefix_tokens = Gauge("seq2serve_prefix_cache_tokens",
                                   "Decoder tokens held by the radix cache", rl, registry=r)
        # --cache-isolation shared: cumulative counts come from the scheduler, hence gauges
        self.scoped = Gauge("seq2serve_cache_scoped", "Shared isolation: public and private "
                            "radix tokens and encoder entries", ["cache", "scope", *rl],
                            registry=r)
        self.promotions = Gauge("seq2serve_cache_promotions", "Shared isolation: entries made "
                                "public (since start)", ["cache", *rl], registry=r)
        self.merged_tokens = Gauge("seq2serve_cache_merged_tokens", "Shared isolation: tokens "
                                   "of private copies freed by merging (since start)",
                                   ["cache", *rl], registry=r)
        # --host-cache-gb
        self.host_tokens = Gauge("seq2serve_host_cache_tokens", "Tokens of K/V held by the "
                                 "host tier", ["cache", *rl], registry=r)
        self.host_loads = Gauge("seq2serve_host_cache_loads", "Host-tier hits (radix: tokens "
                                "loaded back; encoder: inputs) since start", ["cache", *rl],
                                registry=r)

        if replicas > 1:  # the data-parallel router's counts
            self.routed = Gauge("seq2serve_dp_routed_requests", "Requests sent to each replica, "
                                "by why (affinity, least_loaded), since start",
                                ["replica", "reason"], registry=r)
            self.outstanding = Gauge("seq2serve_dp_outstanding_requests", "Requests sent to "
                                     "each replica and not yet ended", ["replica"], registry=r)

    # hooks called by the tokenizer manager
    def on_first_token(self, ttft: float) -> None:
        self.ttft.observe(ttft)

    def on_tokens(self, n: int, gap: float) -> None:
        """n tokens (after the first) that took `gap` seconds together."""
        self.generated_tokens.inc(n)
        for _ in range(n):
            self.itl.observe(gap / max(n, 1))

    def on_finish(self, prompt_tokens: int, e2e: float) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.e2e.observe(e2e)

    def set_scheduler_stats(self, stats: dict, replica: int | None = None) -> None:
        """One scheduler's stats; with data parallelism, replica `replica`'s."""
        tag = [] if self.replicas == 1 else [str(replica)]

        def at(gauge: Gauge, *labels: str) -> Gauge:
            return gauge.labels(*labels, *tag) if labels or tag else gauge

        at(self.running).set(stats.get("running_requests", 0))
        at(self.waiting).set(stats.get("waiting_requests", 0))
        if stats.get("kv_total_tokens"):
            at(self.kv_usage).set(stats["kv_used_tokens"] / stats["kv_total_tokens"])
        if stats.get("cross_total_tokens"):
            at(self.cross_usage).set(stats["cross_used_tokens"] / stats["cross_total_tokens"])
        if stats.get("encoder_cache_lookups"):
            at(self.encoder_hit_rate).set(stats["encoder_cache_hits"]
                                          / stats["encoder_cache_lookups"])
        at(self.encoder_inputs).set(stats.get("encoder_inputs", 0))
        at(self.encoder_forwards).set(stats.get("encoder_forwards", 0))
        at(self.encoder_entries).set(stats.get("encoder_cache_entries", 0))
        at(self.encoder_hot_tokens).set(stats.get("encoder_cache_hot_tokens", 0))
        at(self.encoder_hidden_bytes).set(stats.get("encoder_cache_hidden_bytes", 0))
        if stats.get("radix_queried_tokens"):
            at(self.prefix_hit_rate).set(stats["radix_matched_tokens"]
                                         / stats["radix_queried_tokens"])
        at(self.prefix_tokens).set(stats.get("radix_cache_tokens", 0))
        for cache, prefix, unit in (("radix", "radix_", "tokens"),
                                    ("encoder", "encoder_cache_", "entries")):
            if f"{prefix}promotions" in stats:
                for scope in ("public", "private"):
                    at(self.scoped, cache, scope).set(stats[f"{prefix}{scope}_{unit}"])
                at(self.promotions, cache).set(stats[f"{prefix}promotions"])
                at(self.merged_tokens, cache).set(stats[f"{prefix}merged_tokens"])
        for cache, held, loads in (("radix", "radix_host_tokens", "radix_host_loaded_tokens"),
                                   ("encoder", "encoder_cache_host_tokens",
                                    "encoder_cache_host_hits")):
            if held in stats:
                at(self.host_tokens, cache).set(stats[held])
                at(self.host_loads, cache).set(stats[loads])

    def set_stats(self, stats: dict) -> None:
        """The stats control's payload: one scheduler's, or each replica's ("replicas")."""
        if self.replicas == 1:
            self.set_scheduler_stats(stats)
            return
        for rep in stats["replicas"]:
            self.set_scheduler_stats(rep, rep["replica"])
        router = stats["router"]
        for i in range(self.replicas):
            for reason in ("affinity", "least_loaded"):
                self.routed.labels(str(i), reason).set(router[f"routed_{reason}"][i])
            self.outstanding.labels(str(i)).set(router["outstanding_requests"][i])

    def render(self) -> bytes:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # every HTTP process's, added up
            registry = CollectorRegistry()
            MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)
