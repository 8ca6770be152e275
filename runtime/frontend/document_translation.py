"""Translating documents (issue 42): a request's inputs as documents of one format (text,
markdown, html), their pieces (`documents/`) tokenized together (`SourceEncoder`) and sent
as one batch, and the results put back into each document.

A document that is one piece, itself (a short text input, as `/v1/translations` took before
documents), is one request whose result is returned as it is; repeats of such inputs stay
separate requests (the encoder cache spares their encoder passes). The pieces of every other
document are sent once per distinct (text, source and target language) when decoding is
deterministic (greedy, beams, or seeded), and their translations fanned back out. With
`source_lang: "auto"` each document's source language is detected from its text
(`language_detection.py`) and reported with its result (`detected_language`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.frontend.documents.document_pieces import (
    FORMATS,
    cut_to_fit,
    document_sentences,
    document_text,
    encoder_of,
)
from seq2serve.runtime.frontend.documents.document_stream import DocumentEvent, DocumentStream
from seq2serve.runtime.frontend.documents.piece_batch import PieceBatch
from seq2serve.runtime.frontend.documents.pieces import Piece, reassemble
from seq2serve.runtime.frontend.documents.sentences import segmenter_language
from seq2serve.runtime.frontend.generate_request import (
    GenerateReqInput,
    invalid_text,
    rows_per_prompt,
)
from seq2serve.runtime.frontend.glossary import Glossary
from seq2serve.runtime.frontend.glossary_plan import GlossaryPlan, check_combination, glossary_plan
from seq2serve.runtime.frontend.glossary_search import Run
from seq2serve.runtime.frontend.language_detection import (
    SAMPLE_CHARS,
    detected_source,
    is_auto,
)
from seq2serve.runtime.frontend.tokenizer_manager import TokenizerManager
from seq2serve.runtime.frontend.translation import SourceEncoder, translation_request
from seq2serve.runtime.frontend.translation_options import (
    SourceOutputs,
    TranslationOptions,
    prefix_ids,
)

Route = tuple[str, str]  # a source's (source language, target language)
_NOTHING_TO_TRANSLATE = {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0,
                         "finish_reason": {"type": "stop"}, "pieces": 0}


@dataclass
class DocumentJob:
    documents: list[str]
    fmt: str
    pieces: list[list[Piece]]  # per document
    batch: PieceBatch
    request: GenerateReqInput | None  # the batch's sources; None when there are none
    outputs: SourceOutputs  # what alternatives, a target prefix, scores add to the results
    detected: list[dict[str, Any]] | None = None  # per document, with source_lang "auto"
    glossary: GlossaryPlan | None = None  # the sources holding glossary terms

    async def enforce(self, outputs: list[dict[str, Any]], run: Run) -> list[dict[str, Any]]:
        """The sources' outputs (generate's, in order) with each glossary term its source
        holds placed (`glossary_search.py`; `run` sends one more request and collects its
        results); without a glossary, `outputs` as they are."""
        if self.glossary is None:
            return outputs
        return await self.glossary.enforce(outputs, run)

    def results(self, outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each document's result, shaped as generate's ("text", "output_ids", "meta_info";
        "score", "alternatives" when asked for), from the sources' results in order (k each
        with alternatives). A document that is its own one piece gets that piece's result
        as it is; any other gets its pieces' token counts summed, their output ids joined,
        the first "length" finish among them (else the last one's), and their scores
        summed. With source_lang "auto", each has the `detected_language` of its document."""
        encode = encoder_of(self.fmt)
        out = []
        per_source = self.outputs.results(outputs)
        for doc, pieces, rs in zip(self.documents, self.pieces,
                                   self.batch.per_document(per_source)):
            if _is_itself(doc, pieces, self.fmt):
                out.append(rs[0])
                continue
            result = {"text": reassemble(doc, pieces, [r["text"] for r in rs], encode),
                      "output_ids": [t for r in rs for t in r["output_ids"]],
                      "meta_info": _merged_meta([r["meta_info"] for r in rs])}
            if self.outputs.return_scores:
                result["score"] = float(sum(r["score"] for r in rs))
            if self.outputs.alternatives is not None:  # one piece, whitespace around it
                result["alternatives"] = [{**a, "text": reassemble(doc, pieces, [a["text"]],
                                                                   encode)}
                                          for a in rs[0]["alternatives"]]
            out.append(result)
        if self.detected is not None:
            out = [{**r, "detected_language": d} for r, d in zip(out, self.detected)]
        return out

    async def stream(self, chunks: AsyncIterator[dict[str, Any]] | None
                     ) -> AsyncIterator[dict[str, Any]]:
        """Each document's text in order as the sources' chunks (generate's stream, "index"
        naming the source) come: {"index", "text", "meta_info": {"finish_reason"}} events
        whose texts concatenate to each document's translation; a document's last event has
        its finish reason (the first "length" among its pieces'), and with return_scores
        its score (its pieces' summed), the others None; with source_lang "auto", a
        document's first event has its `detected_language`. Closing this closes `chunks`."""
        stream = DocumentStream(self.documents, self.pieces, self.batch, encoder_of(self.fmt))
        reasons: dict[int, dict] = {}
        scores: dict[int, float] = {}
        announced: set[int] = set()

        def shaped(e: DocumentEvent) -> dict[str, Any]:
            meta: dict[str, Any] = {"finish_reason": None}
            if e.finished:
                slots = self.batch.slots[e.index]
                meta["finish_reason"] = _worst([reasons[k] for k in dict.fromkeys(slots)])
                if self.outputs.return_scores:
                    meta["score"] = float(sum(scores[k] for k in slots))
            out = {"index": e.index, "text": e.delta, "meta_info": meta}
            if self.detected is not None and e.index not in announced:
                announced.add(e.index)
                out["detected_language"] = self.detected[e.index]
            return out

        for event in stream.start():
            yield shaped(event)
        if chunks is None:
            return
        try:
            async for chunk in chunks:
                chunk = self.outputs.streamed(chunk)
                reason = chunk["meta_info"]["finish_reason"]
                if reason is not None:
                    reasons[chunk["index"]] = reason
                    if "score" in chunk:
                        scores[chunk["index"]] = chunk["score"]
                for event in stream.feed(chunk["index"], chunk["text"], reason is not None):
                    yield shaped(event)
        finally:  # a caller that stops reading closes the chunks: their requests abort
            await chunks.aclose()


def document_job(tm: TokenizerManager, model_path: str, inputs: str | list[str], fmt: str,
                 source_lang: str, target_lang: str | list[str],
                 sampling_params: dict[str, Any], stream: bool = False,
                 user: str | None = None,
                 options: TranslationOptions | None = None,
                 glossary: Glossary | None = None) -> DocumentJob:
    """The documents of a translation request as one batch of pieces. ValueError naming the
    field (input, format, source_lang, target_lang, alternatives, target_prefix,
    return_scores, the limit) for what cannot be translated: documents count against
    max_batch_inputs as inputs did (x beams), and each against max_document_chars.
    `source_lang` "auto": each document's own, detected."""
    options = options or TranslationOptions()
    documents = inputs if isinstance(inputs, list) else [inputs]
    targets = target_lang if isinstance(target_lang, list) else [target_lang] * len(documents)
    _check(tm, documents, fmt, targets, sampling_params)
    prefixes = options.prefixes(fmt, len(documents), stream,
                                options.target_prefix is None or tm.is_encoder_decoder)
    if glossary is not None:
        check_combination(glossary, options, stream, prefixes, tm.is_encoder_decoder)
    one_each = options.alternatives is not None or any(prefixes)  # sentence per input
    sampling_params = options.sampling(sampling_params)
    sources, detected = _sources(tm, documents, fmt, source_lang)
    routes = list(zip(sources, targets))
    encoders = {r: SourceEncoder(tm, model_path, *r) for r in dict.fromkeys(routes)}
    sentences = [document_sentences(doc, fmt, segmenter_language(source))
                 for doc, source in zip(documents, sources)]
    max_new = _max_new_tokens(tm, sampling_params)
    encoded = _Encoded(encoders, tm.source_token_limit(max_new))
    encoded.add([(s.text, r) for ss, r in zip(sentences, routes) for s in ss])
    pieces = []
    for i, (doc, ss, route) in enumerate(zip(documents, sentences, routes)):
        try:
            pieces.append([p for s in ss for p in encoded.fitting(doc, s, fmt, route)])
        except ValueError as e:
            raise ValueError(f"input[{i}]: {e}") from None
        if one_each and len(pieces[i]) != 1:
            name = "alternatives" if options.alternatives is not None else "target_prefix"
            raise ValueError(f"{name} takes each input as one sentence: input[{i}] is "
                             f"{len(pieces[i])} pieces (sentences, or clauses of one over the "
                             f"input limit); send its sentences as separate inputs")
    repeatable = _deterministic(sampling_params) and not one_each
    shared = [repeatable and not _is_itself(doc, p, fmt) for doc, p in zip(documents, pieces)]
    batch = PieceBatch.of(pieces, routes, shared)  # its "targets" are the routes
    rows = len(batch.sources) * rows_per_prompt(sampling_params)
    if rows > tm.limits.max_batch_inputs:
        name = "alternatives" if options.alternatives is not None else "input"
        raise ValueError(f"{name}: the documents hold {len(batch.sources)} sentences to "
                         f"translate ({rows} rows with the beams), over this server's limit of "
                         f"{tm.limits.max_batch_inputs} (max_batch_inputs) for one request")
    # one source per document when a prefix is on (one_each: nothing is shared)
    lead = [1 + len(encoders[r].decoder_prompt or []) for r in batch.targets]
    prefix = (prefix_ids(tm, prefixes, lead, max_new) if any(prefixes)
              else [[] for _ in batch.sources])
    outputs = SourceOutputs(tm.tokenizer, prefix, sampling_params, options.alternatives,
                            options.return_scores)
    request, plan = None, None
    if batch.sources:
        bases = [encoders[r].decoder_prompt for r in batch.targets]
        sources_ids = [encoded.ids[(s, t)] for s, t in zip(batch.sources, batch.targets)]
        if glossary is not None:
            plan = glossary_plan(tm, glossary, batch.sources, sources_ids, bases,
                                 sampling_params, max_new, user)
        request = translation_request(
            sources_ids,
            [(b or []) + p if p else b for b, p in zip(bases, prefix)], sampling_params,
            stream, user,
            # HF's generate counts no token of a given decoder_input_ids as generated
            forced=[0 if p else len(b or []) for b, p in zip(bases, prefix)],
            return_logprob=outputs.logprobs)
    return DocumentJob(documents, fmt, pieces, batch, request, outputs, detected, plan)


def _sources(tm: TokenizerManager, documents: list[str], fmt: str,
             source_lang: str) -> tuple[list[str], list[dict[str, Any]] | None]:
    """Each document's source language, and with "auto" what was detected (per document)."""
    if not is_auto(source_lang):
        return [source_lang] * len(documents), None
    found = [detected_source(tm.languages, document_text(doc, fmt, SAMPLE_CHARS), f"input[{i}]")
             for i, doc in enumerate(documents)]
    return [code for code, _ in found], [d for _, d in found]


class _Encoded:
    """Every sentence's encoder input, tokenized in one call per route (source and target
    language); a sentence over the input limit is cut at clause boundaries (its pieces
    tokenized as it is cut)."""

    def __init__(self, encoders: dict[Route, SourceEncoder], limit: int) -> None:
        self.encoders, self.limit = encoders, limit
        self.ids: dict[tuple[str, Route], list[int]] = {}  # (text, route) -> encoder input

    def add(self, keys: list[tuple[str, Route]]) -> None:
        todo = [k for k in dict.fromkeys(keys) if k not in self.ids]
        for route, encoder in self.encoders.items():
            texts = [text for text, r in todo if r == route]
            self.ids.update(zip(((text, route) for text in texts), encoder.encode(texts)))

    def fits(self, text: str, route: Route) -> bool:
        self.add([(text, route)])
        return len(self.ids[(text, route)]) <= self.limit

    def fitting(self, doc: str, sentence: Piece, fmt: str, route: Route) -> list[Piece]:
        if len(self.ids[(sentence.text, route)]) <= self.limit:
            return [sentence]
        return cut_to_fit(doc, sentence, fmt, lambda text: self.fits(text, route))


def _check(tm: TokenizerManager, documents: list, fmt: str, targets: list,
           sampling_params: dict[str, Any]) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    for name in ("n", "num_return_sequences"):
        if (sampling_params.get(name) or 1) != 1:
            raise ValueError(f"{name} must be 1 for a translation (one translation per input)")
    if not documents:
        raise ValueError("input is an empty list")
    limits = tm.limits
    if len(documents) > limits.max_batch_inputs:
        raise ValueError(f"input has {len(documents)} documents, over this server's limit of "
                         f"{limits.max_batch_inputs} (max_batch_inputs)")
    if len(targets) != len(documents):
        raise ValueError(f"target_lang has {len(targets)} entries for {len(documents)} inputs")
    for i, doc in enumerate(documents):
        if not isinstance(doc, str) or not doc:
            raise ValueError(f"input[{i}] must be a non-empty string")
        if len(doc) > limits.max_document_chars:
            raise ValueError(f"input[{i}] is {len(doc)} characters, over this server's limit "
                             f"of {limits.max_document_chars} characters per document "
                             f"(max_document_chars)")
        problem = invalid_text(doc, f"input[{i}]")
        if problem:
            raise ValueError(problem)


def _is_itself(document: str, pieces: list[Piece], fmt: str) -> bool:
    """The document is one piece, all of it, sent as it is (a short input)."""
    return (len(pieces) == 1 and pieces[0].text == document and fmt != "html")


def _deterministic(sp: dict[str, Any]) -> bool:
    """Equal sources give equal translations: greedy, a beam search, or seeded sampling."""
    return (sp.get("num_beams") or 1) > 1 or sp.get("temperature", 1.0) == 0 \
        or sp.get("seed") is not None


def _max_new_tokens(tm: TokenizerManager, sp: dict[str, Any]) -> int:
    given = sp.get("max_new_tokens")
    if isinstance(given, int) and not isinstance(given, bool):
        return given
    cap = tm.limits.max_new_tokens
    default = SamplingParams.max_new_tokens
    return default if cap is None else min(default, cap)


def _worst(reasons: list[dict | None]) -> dict | None:
    if not reasons:
        return dict(_NOTHING_TO_TRANSLATE["finish_reason"])
    return next((r for r in reasons if r and r.get("type") == "length"), reasons[-1])


def _merged_meta(metas: list[dict[str, Any]]) -> dict[str, Any]:
    if not metas:
        return {**_NOTHING_TO_TRANSLATE, "finish_reason": dict(
            _NOTHING_TO_TRANSLATE["finish_reason"])}
    if len(metas) == 1:
        return {**metas[0], "pieces": 1}
    return {"prompt_tokens": sum(m["prompt_tokens"] for m in metas),
            "completion_tokens": sum(m["completion_tokens"] for m in metas),
            "cached_tokens": sum(m.get("cached_tokens") or 0 for m in metas),
            "finish_reason": _worst([m["finish_reason"] for m in metas]),
            "pieces": len(metas)}
