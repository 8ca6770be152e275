"""`PieceBatch`: every piece of every document of a request as one batch of sources, a
source repeated across or within documents (headers, UI strings, boilerplate) sent once
and its translation fanned back out. Sending it once is cheaper than letting the encoder
cache absorb the repeats: the cache spares a repeat's encoder pass but not its decoding
(docs/translation.md has the measurement)."""

from __future__ import annotations

from dataclasses import dataclass

from seq2serve.runtime.frontend.documents.pieces import Piece


@dataclass
class PieceBatch:
    sources: list[str]  # what is sent, in order of first use
    targets: list[str]  # each source's target language
    slots: list[list[int]]  # per document, per piece: the index of its source

    @classmethod
    def of(cls, pieces: list[list[Piece]], targets: list[str], shared: list[bool]) -> PieceBatch:
        """`pieces` and `targets` per document. A piece of a document whose `shared` is true
        shares its source with every equal (text, target) of such documents; other
        documents' pieces are each sent on their own (repeated inputs that should stay
        independent requests: sampled ones, or a list of short inputs whose results carry
        their own encoder-cache hits)."""
        sources, source_targets, slots = [], [], []
        seen: dict[tuple[str, str], int] = {}
        for doc_pieces, target, share in zip(pieces, targets, shared):
            doc_slots = []
            for piece in doc_pieces:
                key = (piece.text, target)
                if share and key in seen:
                    doc_slots.append(seen[key])
                    continue
                if share:
                    seen[key] = len(sources)
                doc_slots.append(len(sources))
                sources.append(piece.text)
                source_targets.append(target)
            slots.append(doc_slots)
        return cls(sources, source_targets, slots)

    def per_document(self, results: list) -> list[list]:
        """Each document's share of the sources' results (one per source, in order)."""
        assert len(results) == len(self.sources), (len(results), len(self.sources))
        return [[results[k] for k in doc_slots] for doc_slots in self.slots]

    def users(self) -> list[list[int]]:
        """For each source, the documents that use it."""
        out: list[list[int]] = [[] for _ in self.sources]
        for d, doc_slots in enumerate(self.slots):
            for k in dict.fromkeys(doc_slots):
                out[k].append(d)
        return out
