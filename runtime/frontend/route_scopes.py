"""RouteScopes: which of the router's affinity entries a request may use, by cache isolation.

The router's affinity is a side channel: a request sent to the replica that cached its source
or prefix (`meta_info.replica`, the affinity counters) tells its sender that someone sent that
content before. So the router sees no more than the caches would let the request reuse
(RadixCache and EncoderCache, by `SharingRule`):

- `none`: one namespace for everyone;
- `user`: the request's user's own (requests without a user: one anonymous user, as in the
  caches);
- `shared`: the user's own, and public entries: content that `public_min_users` distinct users
  sent within the current window, counted with the caches' own `SharingRule`. A request counts
  after it is routed, so the request that makes content public is routed without it.

Entries are keys hashed with their namespace; the router itself knows nothing of users.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from seq2serve.runtime.config.server_args import CacheIsolation
from seq2serve.runtime.frontend.dp_router import RouteKey, routing_keys
from seq2serve.runtime.memory.cache_sharing import ANONYMOUS, SharingRule, UsageWindow
from seq2serve.runtime.messages.io_struct import TokenizedRequest

_PUBLIC_NS = ("public",)


def _within(keys: list[RouteKey], namespace: tuple) -> list[RouteKey]:
    return [RouteKey(hash((namespace, k.key)), k.kind, k.tokens) for k in keys]


class RouteScopes:
    def __init__(self, isolation: CacheIsolation, max_keys: int = 1 << 16,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.mode = isolation.mode
        self.rule = (SharingRule(isolation.public_min_users, isolation.window_seconds, clock)
                     if self.mode == "shared" else None)
        self.usage: OrderedDict[int, UsageWindow] = OrderedDict()  # content key -> its users
        self.max_keys = max_keys

    def keys(self, tr: TokenizedRequest) -> tuple[list[RouteKey], list[RouteKey]]:
        """(the entries this request may be routed by, the entries to record where it went)."""
        content = routing_keys(tr)
        if self.mode == "none":
            return content, content
        user = tr.user or ANONYMOUS
        own = _within(content, ("user", user))
        if self.rule is None:
            return own, own
        public = _within(content, _PUBLIC_NS)
        lookup = own + [p for c, p in zip(content, public) if self._is_public(c.key)]
        record = own + [p for c, p in zip(content, public) if self._touch(c.key, user)]
        return lookup, record

    def _is_public(self, key: int) -> bool:
        usage = self.usage.get(key)
        if usage is None:
            return False
        usage.roll(self.rule.epoch())
        return usage.u_cnt >= self.rule.min_users

    def _touch(self, key: int, user: str) -> bool:
        usage = self.usage.get(key)
        if usage is None:
            usage = self.usage[key] = UsageWindow(epoch=self.rule.epoch())
            while len(self.usage) > self.max_keys:  # bounded, as the router's table
                self.usage.popitem(last=False)
        self.usage.move_to_end(key)
        return self.rule.touch(usage, user)
