"""A translation's alternatives, target prefix and scores (issue 42): LibreTranslate's
`alternatives` (the k best translations of a k-beam search), CTranslate2's `target_prefix`
(the start a translation is forced to have: interactive translation) and `return_scores`.
`TranslationOptions` checks them (a ValueError that starts with the field's name) and says
what they change in the request; `SourceOutputs` adds what they give to each source's
results."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from seq2serve.runtime.config.sampling_params import MAX_BEAMS
from seq2serve.runtime.frontend.generate_request import invalid_text
from seq2serve.runtime.frontend.incremental_detokenizer import IncrementalDetokenizer
from seq2serve.runtime.frontend.tokenizer_manager import TokenizerManager


@dataclass(frozen=True)
class TranslationOptions:
    """`alternatives` k: the k best translations of a beam search of max(k, the request's
    beams) beams, best first; the first is the translation. `target_prefix`: the text each
    translation starts with (one for every input, or a list with one per input; "": none).
    `return_scores`: each translation's score. Alternatives and prefixes take each input as
    one sentence of format "text" (the whitespace around it kept)."""

    alternatives: int | None = None
    target_prefix: str | list[str] | None = None
    return_scores: bool = False

    def prefixes(self, fmt: str, documents: int, stream: bool,
                 encoder_decoder: bool = True) -> list[str]:
        """Each document's prefix ("": none), once every check that needs no tokenizer
        passed (`encoder_decoder`: the model's kind, which a prefix needs)."""
        k = self.alternatives
        if k is not None:
            if not _is_int(k) or not 1 <= k <= MAX_BEAMS:
                raise ValueError(f"alternatives must be an integer in [1, {MAX_BEAMS}] (the "
                                 f"most beams a search may have), got {k!r}")
            if stream:
                raise ValueError("alternatives cannot be combined with stream: they come from "
                                 "a beam search, whose results are known only when it ends")
        if self.return_scores is not True and self.return_scores is not False:
            raise ValueError(f"return_scores must be true or false, got {self.return_scores!r}")
        prefixes = self._each(documents)
        for name, on in (("alternatives", k is not None), ("target_prefix", any(prefixes))):
            if on and fmt != "text":
                raise ValueError(f'{name} takes each input as one sentence of format "text", '
                                 f"not {fmt} documents")
        if any(prefixes) and not encoder_decoder:
            raise ValueError("target_prefix needs an encoder-decoder model (this one is "
                             "decoder-only)")
        return prefixes

    def sampling(self, sp: dict[str, Any]) -> dict[str, Any]:
        """The sampling params with the beam search alternatives ask for: num_beams max(k,
        the request's), num_return_sequences k."""
        k = self.alternatives
        if k is None:
            return sp
        beams = max(k, sp.get("num_beams") or 1)
        if beams > 1:  # what a beam search cannot honour
            given = [name for name, on in (
                ("temperature", (sp.get("temperature") or 0) > 0),
                ("top_p", sp.get("top_p") not in (None, 1, 1.0)),
                ("seed", sp.get("seed") is not None), ("stop", bool(sp.get("stop")))) if on]
            if given:
                raise ValueError(f"alternatives come from a beam search ({beams} beams), which "
                                 f"does not sample or stop at strings: it cannot be combined "
                                 f"with {', '.join(given)}")
        return {**sp, "num_beams": beams, "num_return_sequences": k}

    def _each(self, documents: int) -> list[str]:
        p = self.target_prefix
        if p is None:
            return [""] * documents
        if isinstance(p, str):
            return [p] * documents
        if not isinstance(p, list) or not all(isinstance(x, str) for x in p):
            raise ValueError("target_prefix must be a string or a list of strings (one per "
                             "input)")
        if len(p) != documents:
            raise ValueError(f"target_prefix has {len(p)} entries for {documents} inputs")
        return list(p)


def prefix_ids(tm: TokenizerManager, prefixes: list[str], lead: list[int],
               max_new_tokens: int) -> list[list[int]]:
    """Each prefix's tokens as the tokenizer writes target text, without special tokens, in
    one call (`TranslationLanguages.target_ids_many`: the shared tokenizer never switches to
    its target mode). `lead[i]`: the decoder tokens before prefix i (the start token, a
    target-language token); with them and max_new_tokens it must fit the decoder's context
    (ValueError naming target_prefix)."""
    lim = tm.model_limits
    room = min(lim.context_length, lim.kv_capacity_tokens) - max_new_tokens
    names = [f"target_prefix[{i}]" for i in range(len(prefixes))]
    for name, text in zip(names, prefixes):
        problem = invalid_text(text, name)
        if problem:
            raise ValueError(problem)
        if len(text) > room * tm.max_token_chars:
            raise ValueError(f"{name} is {len(text)} characters: more than the decoder's room "
                             f"of {room} tokens can hold")
    distinct = [t for t in dict.fromkeys(prefixes) if t]
    tokens = dict(zip(distinct, target_ids(tm, distinct)))
    out = [tokens.get(text, []) for text in prefixes]
    for name, ids, before in zip(names, out, lead):
        if ids and before + len(ids) > room:
            raise ValueError(f"{name} is {len(ids)} tokens: with the {before} decoder tokens "
                             f"before it (start, target language) and max_tokens "
                             f"{max_new_tokens}, {before + len(ids) + max_new_tokens} is over "
                             f"the limit of {room + max_new_tokens} (context length / KV pool)")
    return out


def target_ids(tm: TokenizerManager, texts: list[str]) -> list[list[int]]:
    """Each text's tokens as the tokenizer writes target text, without special tokens."""
    if tm.languages is not None:
        return tm.languages.target_ids_many(texts)
    return tm.tokenizer(texts, add_special_tokens=False).input_ids if texts else []


@dataclass
class SourceOutputs:
    """What the options give each source's outputs (generate's result dicts): a target
    prefix's tokens before the generated ones and the text detokenized from all of them
    together, a score (`score`), the k alternatives (`alternatives`, best first)."""

    tokenizer: Any
    prefixes: list[list[int]]  # per source: its target prefix's tokens ([]: none)
    sampling: dict[str, Any]  # the request's sampling params
    alternatives: int | None = None
    return_scores: bool = False
    _streams: dict[int, IncrementalDetokenizer] = field(default_factory=dict)

    @property
    def scored(self) -> bool:
        return self.return_scores or self.alternatives is not None

    @property
    def logprobs(self) -> bool:
        """A score without beams sums the chosen tokens' log-probs: the request asks for them
        (a beam search reports its own score, `beam_score`)."""
        return self.scored and (self.sampling.get("num_beams") or 1) == 1

    def results(self, outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One result per source from generate's outputs in order (k per source with
        alternatives): the best, with "alternatives" (all k) when asked for."""
        k = self.alternatives or 1
        out = []
        for i in range(len(outputs) // k):
            group = [self._finished(i, o) for o in outputs[i * k:(i + 1) * k]]
            best = dict(group[0])
            if self.alternatives is not None:
                best["alternatives"] = group
            out.append(best)
        return out

    def streamed(self, chunk: dict[str, Any]) -> dict[str, Any]:
        """A chunk of generate's stream ("index": the source): a prefixed source's text
        detokenized from its prefix on (the prefix's text comes with its first chunk), and
        the source's "score" with its last chunk."""
        i, meta = chunk["index"], chunk["meta_info"]
        finished = meta["finish_reason"] is not None
        if not self.prefixes[i] and not (finished and self.scored):
            return chunk  # nothing to add (the common case: a chunk per token, no copy)
        chunk = dict(chunk)
        if self.prefixes[i]:
            head, detok = "", self._streams.get(i)
            if detok is None:
                detok = self._streams[i] = self._detokenizer()
                head = detok.add(self.prefixes[i])
            chunk["text"] = head + detok.add(chunk["output_ids"], finished, _matched(meta))
        if finished:
            self._streams.pop(i, None)
            if self.scored:
                chunk["score"] = _score(meta)
        return chunk

    def _finished(self, source: int, output: dict[str, Any]) -> dict[str, Any]:
        out = dict(output)
        meta = out["meta_info"] = dict(out["meta_info"])
        prefix = self.prefixes[source]
        if prefix:
            out["output_ids"] = prefix + out["output_ids"]
            out["text"] = self._detokenizer().add(out["output_ids"], True, _matched(meta))
        if self.scored:
            out["score"] = _score(meta)
        if self.logprobs:  # asked for the score only
            meta.pop("output_token_logprobs", None)
            meta.pop("output_top_logprobs", None)
        return out

    def _detokenizer(self) -> IncrementalDetokenizer:
        stop = self.sampling.get("stop") or []
        return IncrementalDetokenizer(self.tokenizer,
                                      self.sampling.get("skip_special_tokens", True),
                                      [stop] if isinstance(stop, str) else list(stop))


def _score(meta: dict[str, Any]) -> float:
    """A beam search's score as HF's `sequences_scores` (its log-probs' sum over the length
    ** length_penalty), else the sum of the chosen tokens' log-probs."""
    if "beam_score" in meta:
        return float(meta["beam_score"])
    return float(sum(lp for lp, _ in meta.get("output_token_logprobs", [])))


def _matched(meta: dict[str, Any]) -> str | None:
    matched = (meta["finish_reason"] or {}).get("matched")
    return matched if isinstance(matched, str) else None


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
