"""DataParallelRouter: which data-parallel replica a request goes to.

A request goes to the replica that most likely holds what it can reuse: its encoder inputs'
outputs (the text source's and each image's content key, the keys the EncoderCache uses) and
its decoder prefix (chained hashes of 16-token blocks, the way the radix cache matches
pages). The router remembers where it sent each key in a bounded LRU table, so a long-running
server's memory stays flat; it does not hear of evictions, so an affinity is a good guess,
never a promise (a replica that evicted the entry just recomputes it). With no affinity, or
when the replica it points to is far busier than the least loaded one (SGLang's router keeps
the same balance guard), the request goes to the replica with the fewest outstanding tokens
(ties in turn).

The router deals only in keys and counts (no sockets, no tensors, no users): the
TokenizerManager's `SchedulerLink` calls `route` as it sends and `release` when a request ends.
Which keys a request may be routed by is `RouteScopes`' (route_scopes.py): under cache
isolation, only its own user's and public ones, so that neither the replica nor the affinity
counters tell a user what another sent.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from seq2serve.runtime.messages.io_struct import TokenizedRequest

BLOCK_TOKENS = 16  # decoder prefix granularity (the default page size)
MAX_PREFIX_BLOCKS = 64  # prefixes matched up to 1024 tokens: hashing stays cheap
ENCODER, PREFIX = 0, 1


@dataclass(frozen=True)
class RouteKey:
    key: int  # a hash of what can be reused
    kind: int  # ENCODER (reuse adds up over inputs) or PREFIX (the longest counts)
    tokens: int  # tokens a hit saves


def routing_keys(tr: TokenizedRequest) -> list[RouteKey]:
    """What of this request a replica may have cached: its encoder inputs, then its decoder
    prefix blocks (under its encoder inputs: an encoder-decoder's prefixes are per source)."""
    keys = []
    seed = 0
    if tr.encoder_key is not None:
        keys.append(RouteKey(hash(("enc", tr.encoder_key)), ENCODER, len(tr.encoder_input_ids)))
        seed = hash((seed, tr.encoder_key))
    for payload in tr.encoder_inputs:
        keys.append(RouteKey(hash(("enc", payload.key)), ENCODER, payload.num_tokens))
        seed = hash((seed, payload.key))
    ids = tr.decoder_input_ids
    h = seed
    for j in range(min(len(ids) // BLOCK_TOKENS, MAX_PREFIX_BLOCKS)):
        h = hash((h, tuple(ids[j * BLOCK_TOKENS:(j + 1) * BLOCK_TOKENS])))
        keys.append(RouteKey(h, PREFIX, (j + 1) * BLOCK_TOKENS))
    # the whole prompt, however short: n samples of one prompt, repeated short prompts
    keys.append(RouteKey(hash((seed, tuple(ids))), PREFIX, len(ids)))
    return keys


def request_cost(tr: TokenizedRequest) -> int:
    """Outstanding tokens a request puts on its replica (at most; it may stop earlier)."""
    sp = tr.sampling_params
    images = sum(p.num_tokens for p in tr.encoder_inputs)
    return (len(tr.encoder_input_ids) + images + len(tr.decoder_input_ids)
            + sp.max_new_tokens * max(sp.num_beams, 1))


class DataParallelRouter:
    """Chooses a replica per request; counts each replica's outstanding requests and tokens.

    Ownership: `route` adds a request's cost to the replica it picks, `release` (called once
    per routed request, when it ends however it ends) takes it off again."""

    def __init__(self, replicas: int, max_keys: int = 1 << 16,
                 balance_abs: int = 32, balance_rel: float = 1.5) -> None:
        assert replicas >= 1
        self.replicas = replicas
        self.max_keys = max_keys
        # affinity is overridden when its replica has more than balance_abs requests over
        # the least loaded one and more than balance_rel times as many
        self.balance_abs, self.balance_rel = balance_abs, balance_rel
        self.table: OrderedDict[int, int] = OrderedDict()  # key -> replica, oldest first
        self.tokens = [0] * replicas  # outstanding tokens per replica
        self.requests = [0] * replicas  # outstanding requests per replica
        self.routed = {"affinity": [0] * replicas, "least_loaded": [0] * replicas}
        self.turn = 0  # the replica first in line among equally loaded ones

    def route(self, keys: list[RouteKey], cost: int,
              record: list[RouteKey] | None = None) -> int:
        """The replica for a request with these keys; its cost counts there until release.
        `record` (default: `keys`): the keys remembered as now on that replica."""
        # ties (idle replicas, say) go round in turn, so that work and caches spread
        n = self.replicas
        least = min(range(n), key=lambda r: (self.tokens[r], self.requests[r],
                                             (r - self.turn) % n))
        best = self._affinity(keys)
        if best is not None and not self._overloaded(best, least):
            choice, reason = best, "affinity"
        else:
            choice, reason = least, "least_loaded"
            self.turn = (least + 1) % n
        self.routed[reason][choice] += 1
        self.tokens[choice] += cost
        self.requests[choice] += 1
        for k in keys if record is None else record:
            self.table[k.key] = choice
            self.table.move_to_end(k.key)
        while len(self.table) > self.max_keys:
            self.table.popitem(last=False)
        return choice

    def release(self, replica: int, cost: int) -> None:
        self.tokens[replica] -= cost
        self.requests[replica] -= 1
        assert self.tokens[replica] >= 0 and self.requests[replica] >= 0

    def _affinity(self, keys: list[RouteKey]) -> int | None:
        """The replica whose cached entries would save the most tokens (None: no replica's)."""
        encoder = [0] * self.replicas
        prefix = [0] * self.replicas
        for k in keys:
            r = self.table.get(k.key)
            if r is None:
                continue
            if k.kind == ENCODER:
                encoder[r] += k.tokens
            else:
                prefix[r] = max(prefix[r], k.tokens)
        saved = [e + p for e, p in zip(encoder, prefix)]
        best = max(range(self.replicas), key=lambda r: (saved[r], -self.tokens[r]))
        return best if saved[best] > 0 else None

    def _overloaded(self, replica: int, least: int) -> bool:
        mine, low = self.requests[replica], self.requests[least]
        return mine > low + self.balance_abs and mine > self.balance_rel * low

    def stats(self) -> dict:
        return {"outstanding_requests": list(self.requests),
                "outstanding_tokens": list(self.tokens),
                "routed_affinity": list(self.routed["affinity"]),
                "routed_least_loaded": list(self.routed["least_loaded"]),
                "affinity_keys": len(self.table)}
