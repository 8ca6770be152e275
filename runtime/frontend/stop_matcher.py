"""How much of a growing text may still become a stop string: an Aho-Corasick automaton over
the stop strings, fed each new character once, so a token costs the same whatever the stop
strings' length (issue 39: 16 stop strings of 10,000 characters took the detokenizer's CPU
from 0.8 s to 86 s when every token re-checked every prefix of every string)."""

from __future__ import annotations


class StopMatcher:
    """`feed(text)` then `held`: the length of the longest suffix of everything fed that is a
    proper prefix of a stop string (text that must not be shown yet)."""

    def __init__(self, stop: list[str]) -> None:
        self.longest = max(map(len, stop), default=0)
        self.goto: list[dict[str, int]] = [{}]
        depth = [0]
        for s in stop:
            node = 0
            for ch in s:
                nxt = self.goto[node].get(ch)
                if nxt is None:
                    nxt = len(self.goto)
                    self.goto[node][ch] = nxt
                    self.goto.append({})
                    depth.append(depth[node] + 1)
                node = nxt
        self.fail = [0] * len(self.goto)
        # per node: the depth of the longest suffix that still has children (a proper prefix)
        self.keep = [0] * len(self.goto)
        order = list(self.goto[0].values())
        for node in order:  # breadth first: a node's fail link is shallower, so done already
            for ch, child in self.goto[node].items():
                f = self.fail[node]
                while f and ch not in self.goto[f]:
                    f = self.fail[f]
                self.fail[child] = self.goto[f].get(ch, 0) if node else 0
                order.append(child)
        for node in order:
            self.keep[node] = depth[node] if self.goto[node] else self.keep[self.fail[node]]
        self.state = 0

    def feed(self, text: str) -> None:
        goto, fail, node = self.goto, self.fail, self.state
        for ch in text:
            while node and ch not in goto[node]:
                node = fail[node]
            node = goto[node].get(ch, 0)
        self.state = node

    def reset(self, text: str) -> None:
        """Start over on `text` (only its last `longest` characters can matter)."""
        self.state = 0
        self.feed(text[-self.longest:] if self.longest else "")

    @property
    def held(self) -> int:
        return self.keep[self.state]
