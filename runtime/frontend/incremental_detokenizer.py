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
    the detokenizer process's time streaming 256 requests (py-spy, H200). Whisper's
    tokenizer drops its timestamp tokens in `decode`, not in `_decode` (HF's text of a
    transcription without timestamps has none of them): it is called through `decode`."""
    if hasattr(tokenizer, "_filter_timestamp_ids"):
        return tokenizer.decode
    return getattr(tokenizer, "_decode", None) or tokenizer.decode


def batch_decoder(tokenizer):
    """`f(list of id lists, skip_special_tokens) -> texts`, equal to `_decoder`'s one by one: a
    `tokenizers`-backed tokenizer decodes them in one call (then its clean-up, where its
    `_decode` applies one); any other, one by one."""
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # (another transformers layout: one by one)
        TokenizersBackend = None
    raw = getattr(tokenizer, "_tokenizer", None)
    if (TokenizersBackend is None or not isinstance(tokenizer, TokenizersBackend)
            or type(tokenizer)._decode is not TokenizersBackend._decode
            or not hasattr(raw, "decode_batch")):
        one = _decoder(tokenizer)
        return lambda seqs, skip: [one(s, skip_special_tokens=skip) for s in seqs]
    bpe = type(tokenizer.backend_tokenizer.model).__name__ == "BPE"
    clean = tokenizer.clean_up_tokenization_spaces and not (
        bpe and not getattr(tokenizer, "clean_up_tokenization_spaces_for_bpe_even_though_it_"
                                       "will_corrupt_output", False))

    def decode(seqs: list[list[int]], skip: bool) -> list[str]:
        texts = raw.decode_batch(seqs, skip_special_tokens=skip)
        return [tokenizer.clean_up_tokenization(t) for t in texts] if clean else texts
    return decode


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
        self.before = ""  # the text of ids[prefix_offset:read_offset]

    def _decode(self, ids: list[int]) -> str:
        return _decoder(self.tokenizer)(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, new_ids: list[int], finished: bool = False,
            matched_stop: str | None = None) -> str:
        """Append tokens; return the text that may be shown now (all of it when finished).
        `matched_stop`: the stop string the scheduler finished the request on; the text ends
        before its last occurrence (the one the last token completed: earlier ones, before
        `min_new_tokens`, stay)."""
        windows = self.push(new_ids)
        return self.finish_step([self._decode(w) for w in windows], finished, matched_stop)

    def push(self, new_ids: list[int]) -> list[list[int]]:
        """Append tokens; the id windows whose texts `finish_step` needs (none when there is no
        new token): the window from `prefix_offset`, and the new tokens alone. A caller with
        many requests decodes every request's windows in one batch (`batch_decoder`)."""
        self.ids.extend(new_ids)
        if self.read_offset == len(self.ids):
            return []
        return [self.ids[self.prefix_offset:], self.ids[self.read_offset:]]

    def finish_step(self, decoded: list[str], finished: bool = False,
                    matched_stop: str | None = None) -> str:
        """`add`'s second half, with the texts of `push`'s windows."""
        if decoded:
            self._advance(*decoded, final=finished)
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

    def _advance(self, window: str, alone: str, final: bool) -> None:
        """`window`: the text of the ids from `prefix_offset`; `alone`: of the new ids alone.
        The text of the ids from `prefix_offset` to `read_offset` is `before`, kept from the
        step before (the window then, or its new ids alone when the window moved to them)."""
        if window.endswith(_INCOMPLETE) and not final:
            return  # a multi-byte character is not complete yet (at the end: shown as is)
        if window.startswith(self.before):
            new = window[len(self.before):]
            self.text += new
            if self.matcher is not None:
                self.matcher.feed(new)
        else:  # the tokenizer normalized across the boundary: resynchronize
            self.text = self._decode(self.ids)
            if self.matcher is not None:
                self.matcher.reset(self.text)
        # Start the next window at the new tokens only if they show a visible character on
        # their own: a window that starts with a bare space piece would have it stripped.
        if alone.strip():
            self.prefix_offset, self.before = self.read_offset, alone
        else:
            self.before = window
        self.read_offset = len(self.ids)

    def _safe_end(self) -> int:
        """Hold back a tail that could still grow into a stop string (the matcher has seen
        every character once: the cost per token does not grow with the stop strings)."""
        return len(self.text) - (self.matcher.held if self.matcher is not None else 0)
