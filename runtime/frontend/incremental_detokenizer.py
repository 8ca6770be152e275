"""Turns a growing list of token ids into text, piece by piece, without splitting a multi-byte
character or losing SentencePiece word-boundary spaces, and holding back text that may be the
start of a stop string.

Whether a stop string ended the request is the scheduler's decision (it stops generating
there; `Req.check_finished`); this only cuts the text where it says, at the occurrence of the
matched string that the request's last token completed."""

from __future__ import annotations

from seq2serve.runtime.frontend.stop_matcher import StopMatcher

_INCOMPLETE = "\ufffd"  # what a tokenizer decodes a partial UTF-8 sequence to


def _decoder(tokenizer):
    """`tokenizer.decode` for a list of ints. A transformers tokenizer's `decode` first
    converts its argument element by element (`to_py_obj`, for tensors and arrays) and then
    calls `_decode`; ids here are a list of ints already, and that conversion was a quarter of
    the detokenizer process's time streaming 256 requests (py-spy, H200)."""
    return getattr(tokenizer, "_decode", None) or tokenizer.decode


class IncrementalDetokenizer:
    """Decodes a window that starts a few tokens back (`prefix_offset`) and emits what the new
    tokens add to it. Decoding a window rather than single tokens keeps the leading space a
    SentencePiece word piece owes to its context; waiting while the window ends in U+FFFD keeps
    multi-byte characters whole."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True,
                 stop: list[str] | None = None) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stop = stop or []
        self.matcher = StopMatcher(self.stop) if self.stop else None
        self.ids: list[int] = []
        self.text = ""  # every complete character decoded so far
        self.sent = 0  # characters of `text` already handed out
        self.prefix_offset = 0
        self.read_offset = 0

    def _decode(self, ids: list[int]) -> str:
        return _decoder(self.tokenizer)(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, new_ids: list[int], finished: bool = False,
            matched_stop: str | None = None) -> str:
        """Append tokens; return the text that may be shown now (all of it when finished).
        `matched_stop`: the stop string the scheduler finished the request on; the text ends
        before its last occurrence (the one the last token completed: earlier ones, before
        `min_new_tokens`, stay)."""
        self.ids.extend(new_ids)
        self._advance(final=finished)
        if not finished:
            end = self._safe_end()
        else:
            # (no decode of the whole text at the end: at 544 tokens it was 0.2-0.6 ms a
            # request, and 128 streams finishing in one step stalled every stream 80 ms)
            if matched_stop:
                cut = self.text.rfind(matched_stop)
                if cut >= self.sent:
                    self.text = self.text[:cut]
            end = len(self.text)
        piece = self.text[self.sent:end]
        self.sent = max(self.sent, end)
        return piece

    def _advance(self, final: bool = False) -> None:
        if self.read_offset == len(self.ids):
            return  # no new token
        window = self._decode(self.ids[self.prefix_offset:])
        if window.endswith(_INCOMPLETE) and not final:
            return  # a multi-byte character is not complete yet (at the end: shown as is)
        before = self._decode(self.ids[self.prefix_offset:self.read_offset])
        if window.startswith(before):
            new = window[len(before):]
            self.text += new
            if self.matcher is not None:
                self.matcher.feed(new)
        else:  # the tokenizer normalized across the boundary: resynchronize
            self.text = self._decode(self.ids)
            if self.matcher is not None:
                self.matcher.reset(self.text)
        # Start the next window at the new tokens only if they show a visible character on
        # their own: a window that starts with a bare space piece would have it stripped.
        if self._decode(self.ids[self.read_offset:]).strip():
            self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)

    def _safe_end(self) -> int:
        """Hold back a tail that could still grow into a stop string (the matcher has seen
        every character once: the cost per token does not grow with the stop strings)."""
        return len(self.text) - (self.matcher.held if self.matcher is not None else 0)
