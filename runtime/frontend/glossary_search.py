"""Glossary terms forced into translations (issue 42): a search over where each missing target
term goes, the model choosing by its own scores. docs/translation.md ("Glossaries") says why
this and not a grammar alone, and what it costs.

For a source whose translation (decoded as the request asks: greedy or beams) lacks a
required target term, every word start p of that translation y (and its end) is a candidate:
the decoder is forced through y[:p] and the term's tokens (a decoder prompt, as a
`target_prefix` is), then decodes the rest as the request asks. Each candidate's whole output
is then scored by the model, teacher-forced (the sum of its tokens' log-probs, end of
sequence included: the model's probability of that translation), and the best one that holds
the term as a whole word and stopped by itself (else the best) replaces y. Terms are
placed one at a time, in source order, each round over every source that still lacks one,
as one batch; a term the translation already holds is not placed again. A source whose
translation holds every term is never touched: its result is the first pass's, unchanged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from seq2serve.runtime.frontend.generate_request import GenerateReqInput, split_rows
from seq2serve.runtime.frontend.glossary import holds

MAX_POSITIONS = 48  # candidates per term: word starts of the translation, spread if more
Run = Callable[[GenerateReqInput], Awaitable[list[dict[str, Any]]]]


@dataclass
class GlossarySource:
    """One source sent with a glossary: what it must hold and how to ask the model again."""

    terms: list[str]  # target terms its source holds, in source order
    encoder_ids: list[int]  # its encoder input
    base: list[int]  # decoder tokens before the translation (a target-language token)


@dataclass
class _Candidate:
    source: int
    term: str
    ids: list[int]  # forced translation tokens: y[:p] + the term's


class GlossarySearch:
    """`tokenizer`: the model's; `target_ids(texts)`: each text's tokens as target text,
    without special tokens; `sampling`: the request's sampling params; `max_new`: its
    max_tokens (a candidate's forced tokens count in it, as its own first pass's did)."""

    def __init__(self, tokenizer, target_ids: Callable[[list[str]], list[list[int]]],
                 sources: list[GlossarySource], sampling: dict[str, Any], max_new: int,
                 user: str | None = None, max_rows: int = 1024) -> None:
        self.tokenizer, self.target_ids = tokenizer, target_ids
        self.sources, self.sampling, self.user = sources, sampling, user
        self.special = set(tokenizer.all_special_ids)
        self.max_new = max_new  # the request's max_tokens: a candidate's forced tokens count
        self.max_rows = max_rows  # rows (x beams) of one request: more are sent in parts

    def missing(self, outputs: list[dict[str, Any]]) -> list[int]:
        """The sources whose translation lacks one of their terms."""
        return [i for i, (s, o) in enumerate(zip(self.sources, outputs))
                if any(not holds(o["text"], t) for t in s.terms)]

    async def enforce(self, outputs: list[dict[str, Any]], run: Run) -> list[dict[str, Any]]:
        """The sources' results (one each, in order) with every term placed."""
        outputs = list(outputs)
        rounds = max((len(s.terms) for s in self.sources), default=0)
        for _ in range(rounds):
            todo = self.missing(outputs)
            if not todo:
                break
            candidates = [c for i in todo for c in self._candidates(i, outputs[i])]
            decoded = await self._run(self._decode_request(candidates), run)
            full = [c.ids + o["output_ids"] for c, o in zip(candidates, decoded)]
            scored = await self._scores(candidates, full, run)
            best: dict[int, tuple] = {}
            for c, o, ids, s in zip(candidates, decoded, full, scored):
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
                key = (holds(text, c.term), _stopped(o), _logprob(s))
                if c.source not in best or key > best[c.source][0]:
                    best[c.source] = (key, ids, o)
            for i, (_, ids, o) in best.items():
                outputs[i] = self._result(outputs[i], ids, o)
        return outputs

    def _candidates(self, i: int, output: dict[str, Any]) -> list[_Candidate]:
        source = self.sources[i]
        term = next(t for t in source.terms if not holds(output["text"], t))
        y = [t for t in output["output_ids"] if t not in self.special]
        pieces = self.tokenizer.convert_ids_to_tokens(y)
        starts = [p for p in range(len(y)) if p == 0 or _starts_word(pieces[p])] + [len(y)]
        if len(starts) > MAX_POSITIONS:  # spread evenly, the ends kept
            step = (len(starts) - 1) / (MAX_POSITIONS - 1)
            starts = sorted({starts[round(k * step)] for k in range(MAX_POSITIONS)})
        first, later = self.target_ids([term, " " + term])
        room = self.max_new - 1  # a token left for the end of sequence
        out = []
        for p in starts:
            ids = y[:p] + (later if p else first)
            if len(ids) <= room:
                out.append(_Candidate(i, term, ids))
        if not out:  # not even the term alone fits: the term alone, cut at the limit
            out.append(_Candidate(i, term, first[:max(room, 1)]))
        return out

    def _decode_request(self, candidates: list[_Candidate]) -> GenerateReqInput:
        params = [{**self.sampling, "max_new_tokens": max(1, self.max_new - len(c.ids))}
                  for c in candidates]
        return GenerateReqInput(
            input_ids=[self.sources[c.source].encoder_ids for c in candidates],
            decoder_input_ids=[self.sources[c.source].base + c.ids for c in candidates],
            sampling_params=params, user=self.user, decoder_forced=0)

    async def _scores(self, candidates: list[_Candidate], full: list[list[int]],
                      run: Run) -> list[dict[str, Any]]:
        """Each candidate's whole output teacher-forced: its tokens' log-probs from the first
        translation token on (the decoder's start token is position 0, the base follows);
        one request per length of base (one in practice)."""
        groups: dict[int, list[int]] = {}
        for k, c in enumerate(candidates):
            groups.setdefault(1 + len(self.sources[c.source].base), []).append(k)
        out: list[dict[str, Any]] = [{}] * len(candidates)
        for start, ks in groups.items():
            scored = await self._run(GenerateReqInput(
                input_ids=[self.sources[candidates[k].source].encoder_ids for k in ks],
                decoder_input_ids=[self.sources[candidates[k].source].base + full[k]
                                   for k in ks],
                sampling_params={"max_new_tokens": 1, "temperature": 0.0}, user=self.user,
                return_logprob=True, logprob_start_len=start, decoder_forced=0), run)
            for k, s in zip(ks, scored):
                out[k] = s
        return out

    async def _run(self, obj: GenerateReqInput, run: Run) -> list[dict[str, Any]]:
        """`obj`'s results, sent in parts of at most max_rows rows (max_batch_inputs)."""
        return [r for part in split_rows(obj, self.max_rows) for r in await run(part)]

    def _result(self, first: dict[str, Any], ids: list[int],
                decoded: dict[str, Any]) -> dict[str, Any]:
        meta = dict(first["meta_info"])
        meta["completion_tokens"] = len(ids)
        meta["finish_reason"] = decoded["meta_info"]["finish_reason"]
        meta["glossary_placed"] = meta.get("glossary_placed", 0) + 1
        return {**first, "output_ids": ids, "meta_info": meta,
                "text": self.tokenizer.decode(ids, skip_special_tokens=True)}


def _starts_word(piece: str) -> bool:
    """A token that begins a word: SentencePiece's "▁", byte-level BPE's "Ġ" (a space)."""
    return piece[:1] in ("\u2581", "\u0120", " ")


def _stopped(output: dict[str, Any]) -> bool:
    return (output["meta_info"]["finish_reason"] or {}).get("type") == "stop"


def _logprob(scored: dict[str, Any]) -> float:
    """The model's log-probability of a candidate's whole translation (not over its length:
    a mean rewards padding a translation with tokens the model is sure of)."""
    lps = [lp for lp, _ in scored["meta_info"].get("input_token_logprobs", []) if lp is not None]
    return sum(lps) if lps else float("-inf")
