"""Who may see a cached entry under `--cache-isolation shared`, and the counters that decide it.

Every cached entry (a radix node's pages, an encoder output) is private to the user who made it
until at least `min_users` distinct users have sent the same content within one window of
`window_seconds`; then it becomes public and every user may hit it. Time is cut into windows
by a global epoch (`floor(clock() / window_seconds)`); each piece of content keeps its counters
for the current window (`hit_cur`, its users) and the previous one (`hit_pre`, `u_pre`), rolled
lazily by its own epoch when it is next touched or read. Promotion counts the users of the
current window only; eviction ranks by both windows (an entry hot across users outlives a
private one used once).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

PUBLIC = None  # the owner of a public copy
ANONYMOUS = ""  # requests without a user count as this one user
_USERS_TRACKED = 64  # distinct users remembered per window; counts saturate beyond


@dataclass(eq=False)
class UsageWindow:
    """Hits and distinct users of one piece of content, this window and the previous one."""

    epoch: int = 0
    hit_cur: int = 0
    users: set[str] = field(default_factory=set)  # distinct users this window (u_cnt)
    hit_pre: int = 0
    u_pre: int = 0

    def roll(self, epoch: int) -> None:
        if epoch == self.epoch:
            return
        if epoch == self.epoch + 1:
            self.hit_pre, self.u_pre = self.hit_cur, len(self.users)
        else:
            self.hit_pre = self.u_pre = 0
        self.epoch, self.hit_cur, self.users = epoch, 0, set()

    def touch(self, user: str, epoch: int, hit: bool = True) -> None:
        self.roll(epoch)
        self.hit_cur += hit
        if len(self.users) < _USERS_TRACKED:
            self.users.add(user)

    @property
    def u_cnt(self) -> int:
        return len(self.users)

    def copy(self) -> UsageWindow:
        return UsageWindow(self.epoch, self.hit_cur, set(self.users), self.hit_pre, self.u_pre)


class SharingRule:
    """The promotion rule and the global epoch; one per cache (the caches share the options)."""

    def __init__(self, min_users: int, window_seconds: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.min_users = min_users
        self.window_seconds = window_seconds
        self.clock = clock
        self.promotions = 0  # entries made public
        self.merged_pages = 0  # duplicate pages freed by merging private copies

    def epoch(self) -> int:
        return int(self.clock() // self.window_seconds)

    def touch(self, usage: UsageWindow, user: str, hit: bool = True) -> bool:
        """Count `user` sending this content now; True once it qualifies to be public."""
        epoch = self.epoch()
        usage.touch(user, epoch, hit)
        return usage.u_cnt >= self.min_users

    def priority(self, usage: UsageWindow | None) -> tuple[int, int]:
        """Eviction rank: lower goes first (distinct users, then hits, over both windows)."""
        if usage is None:
            return (0, 0)
        usage.roll(self.epoch())
        return (usage.u_cnt + usage.u_pre, usage.hit_cur + usage.hit_pre)
