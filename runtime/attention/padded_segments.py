"""An encoder batch's packed, ragged inputs as padded groups, for one batched attention product
per group (the CPU backend's encoder path).

Inputs are sorted by length and grouped so that padding stays a small share of a group's
tokens and its score matrix stays bounded; inputs of one length (a benchmark's, a batch of
short sentences) are one group, their packed rows a view without any copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise

import torch

# a group grows while its padded tokens are at most this times its real ones
_MAX_PADDING = 1.25
# and while its scores (inputs x heads x length^2 floats) stay under this many
_MAX_SCORES = 1 << 24


@dataclass
class SegmentGroup:
    """Inputs padded to one length: rows [n, length] of the packed batch (`index`, None when
    the group is one run of equal inputs, `start` its first row) and their key mask."""

    length: int
    count: int
    start: int  # first packed row (a contiguous run of equal lengths)
    index: torch.Tensor | None  # [count * length] packed rows (padding: any valid row)
    valid: torch.Tensor | None  # [count, length] bool: real keys
    rows: torch.Tensor | None  # the packed rows of the real tokens, in group order
    masks: dict = field(default_factory=dict)  # id(position bias) -> additive mask

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """x [tokens, heads, dim] (packed) -> [count, heads, length, dim]."""
        if self.index is None:
            x = x[self.start: self.start + self.count * self.length]
        else:
            x = x.index_select(0, self.index)
        return x.view(self.count, self.length, *x.shape[1:]).transpose(1, 2)


class PaddedSegments:
    def __init__(self, lens: list[int], heads: int, device: torch.device) -> None:
        self.total = sum(lens)
        starts = [0]
        for n in lens:
            starts.append(starts[-1] + n)
        order = sorted(range(len(lens)), key=lambda i: lens[i])
        self.groups: list[SegmentGroup] = []
        group: list[int] = []
        for i in order + [None]:
            if i is not None and group and self._fits(group, i, lens, heads):
                group.append(i)
                continue
            if group:
                self.groups.append(self._group(group, lens, starts, device))
            group = [i]
        # packed rows of the groups' outputs, concatenated in group order -> packed order
        rows = [g.rows if g.rows is not None else
                torch.arange(g.start, g.start + g.count * g.length, device=device)
                for g in self.groups]
        cat = torch.cat(rows) if len(rows) > 1 else rows[0]
        self.identity = len(self.groups) == 1 and self.groups[0].index is None
        self.inverse = None if self.identity else torch.argsort(cat)

    @staticmethod
    def _fits(group: list[int], i: int, lens: list[int], heads: int) -> bool:
        n, length = len(group) + 1, lens[i]  # sorted: the new input is the longest
        real = sum(lens[j] for j in group) + length
        return n * length <= _MAX_PADDING * real and n * heads * length * length <= _MAX_SCORES

    @staticmethod
    def _group(group: list[int], lens: list[int], starts: list[int],
               device: torch.device) -> SegmentGroup:
        length = lens[group[-1]]
        contiguous = (all(lens[j] == length for j in group)
                      and all(starts[b] == starts[a] + length for a, b in pairwise(group)))
        if contiguous:
            return SegmentGroup(length, len(group), starts[group[0]], None, None, None)
        pos = torch.arange(length, device=device)
        first = torch.tensor([starts[j] for j in group], device=device)
        n = torch.tensor([lens[j] for j in group], device=device)
        valid = pos[None, :] < n[:, None]
        index = first[:, None] + torch.minimum(pos[None, :], n[:, None] - 1)
        return SegmentGroup(length, len(group), 0, index.reshape(-1), valid, index[valid])

    def unpad(self, outs: list[torch.Tensor]) -> torch.Tensor:
        """The groups' outputs [count, length, width] -> packed [tokens, width]."""
        flat = []
        for g, o in zip(self.groups, outs):
            o = o.reshape(g.count * g.length, -1)
            flat.append(o if g.valid is None else o[g.valid.reshape(-1)])
        out = torch.cat(flat) if len(flat) > 1 else flat[0]
        return out if self.inverse is None else out.index_select(0, self.inverse)
