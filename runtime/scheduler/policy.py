"""The scheduling policy: in what order waiting requests are admitted, and which running request
gives its memory back when the KV pool is full. The Scheduler asks; it never orders requests
itself, so a different policy is a different class with these methods."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from seq2serve.runtime.scheduler.req import Req


class FairPolicy:
    """Fair admission across callers: the k-th waiting request of a call is admitted after the
    k-th of every other call waiting, so a request of 1,000 prompts does not hold back a
    one-prompt request that arrives after it (start-time fair queueing, one unit each).
    Retraction takes the request that has made the least progress: it loses the least work."""

    def __init__(self) -> None:
        self.waiting: deque[Req] = deque()
        self.group_tags: dict[str, int] = {}  # each caller's last fair_tag
        self.admitted_tag = 0  # fair_tag of the last request admitted

    # --- the waiting queue -------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.waiting)

    def __iter__(self) -> Iterator[Req]:
        return iter(self.waiting)

    def __contains__(self, req: Req) -> bool:
        return req in self.waiting

    def push(self, req: Req, group: str) -> None:
        """A new request of caller `group`."""
        req.fair_tag = max(self.group_tags.get(group, 0), self.admitted_tag) + 1
        self.group_tags[group] = req.fair_tag
        if len(self.group_tags) > 4 * len(self.waiting) + 1024:  # forget finished callers
            self.group_tags = {g: t for g, t in self.group_tags.items()
                               if t > self.admitted_tag}
        i = len(self.waiting)
        while i and self.waiting[i - 1].fair_tag > req.fair_tag:
            i -= 1
        self.waiting.insert(i, req)

    def push_front(self, req: Req) -> None:
        """A retracted request: first to come back."""
        self.waiting.appendleft(req)

    def peek(self) -> Req:
        return self.waiting[0]

    def drop(self) -> Req:
        """Remove the head without admitting it (it was refused)."""
        return self.waiting.popleft()

    def admit(self) -> Req:
        """Remove the head: it is admitted."""
        req = self.waiting.popleft()
        self.admitted_tag = max(self.admitted_tag, req.fair_tag)
        if not self.waiting:  # no caller is behind another: no history needed
            self.group_tags.clear()
        return req

    def remove(self, req: Req) -> None:
        self.waiting.remove(req)

    # --- retraction --------------------------------------------------------------------------
    @staticmethod
    def victim(running: list[Req]) -> Req:
        """The running request to retract when the KV pool cannot grow every request."""
        return min(running, key=lambda r: (len(r.output_ids), -r.arrival_time))
