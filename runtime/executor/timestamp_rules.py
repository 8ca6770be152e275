"""Whisper's timestamp rules, as HF's `WhisperTimeStampLogitsProcessor` applies them, for the
rows of a batch that ask for timestamps (`SamplingParams.timestamps`).

What a row may generate next depends only on the tokens it has generated (the forced prompt
is not counted: HF's `begin_index`), so the host reduces each row's history to three bounds
(`TimestampRows.of`) and the device applies them to all such rows at once:

- the first token is a timestamp, at most `max_initial_index` steps after `<|0.00|>`;
- timestamps come in pairs: after a pair (or the first timestamp) comes no timestamp; after
  a timestamp that follows text comes no text (a timestamp, or the end of text and the
  specials after it);
- timestamps never decrease: below the last one none may come, and after a pair not even it;
- `<|notimestamps|>` never comes;
- when the probability of all timestamps together beats every text token's, the text tokens
  are banned (the log-softmax of the row after the bans above, as HF's).

Beam rows get the same rules on their log-probs (HF's processors act on log-probs there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from seq2serve.runtime.config.timestamp_tokens import TimestampTokens


@dataclass
class TimestampRows:
    rows: torch.Tensor  # [n] int64 batch rows with timestamps
    # [n, 3] int64 per row: text_end (ids below it are banned: 0, eos or `begin`), stamp_lo
    # (timestamps below it are banned), stamp_hi (timestamps from it on are banned); one
    # contiguous tensor (one copy to the device, one broadcast to tensor-parallel ranks)
    bounds: torch.Tensor
    tokens: TimestampTokens

    @classmethod
    def of(cls, rows: list[int], histories: Sequence[Sequence[int]], tokens: TimestampTokens,
           vocab_size: int, device: str) -> TimestampRows:
        """The bounds of each row in `rows`, from its generated tokens (`histories`, aligned)."""
        bounds = [_bounds(h, tokens, vocab_size) for h in histories]
        table = torch.tensor(bounds, dtype=torch.int64).view(len(rows), 3)
        return cls(torch.tensor(rows, dtype=torch.int64).to(device, non_blocking=True),
                   table.to(device, non_blocking=True), tokens)

    def apply(self, logits: torch.Tensor) -> None:
        """Ban what the rules ban in these rows of `logits` (float32, in place)."""
        begin, vocab = self.tokens.begin, logits.shape[-1]
        x = logits[self.rows]
        col = torch.arange(vocab, device=x.device)
        text_end, lo, hi = self.bounds[:, 0:1], self.bounds[:, 1:2], self.bounds[:, 2:3]
        banned = ((col < text_end) | ((col >= begin) & ((col < lo) | (col >= hi)))
                  | (col == self.tokens.no_timestamps))
        x.masked_fill_(banned, float("-inf"))
        logprobs = torch.log_softmax(x, dim=-1)
        stamps = logprobs[:, begin:].logsumexp(dim=-1)
        best_text = logprobs[:, :begin].max(dim=-1).values
        x[:, :begin].masked_fill_((stamps > best_text)[:, None], float("-inf"))
        logits[self.rows] = x


def _bounds(history: Sequence[int], tokens: TimestampTokens,
            vocab_size: int) -> tuple[int, int, int]:
    """(text_end, stamp_lo, stamp_hi) for a row that has generated `history`."""
    begin = tokens.begin
    n = len(history)
    if n == 0:  # a timestamp first, not too far in
        hi = vocab_size if tokens.max_initial_index is None else min(
            vocab_size, begin + tokens.max_initial_index + 1)
        return begin, begin, hi
    last = history[-1] >= begin
    penultimate = n < 2 or history[-2] >= begin
    text_end, lo = 0, begin
    if last and penultimate:  # a pair (or the first timestamp) ends: no timestamp now
        lo = vocab_size
    elif last:  # a segment's end: its pair, or the end of text
        text_end = tokens.eos
    latest = next((t for t in reversed(history) if t >= begin), None)
    if latest is not None:  # never back; after a pair, not the same one again
        lo = max(lo, latest if last and not penultimate else latest + 1)
    return text_end, lo, vocab_size
