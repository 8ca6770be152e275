"""`DocumentStream`: a request's documents streamed each in its own order while their pieces'
translations arrive in any order (a token at a time, or whole). A document's structure is
sent as soon as every piece before it is done; a piece's text as it comes, once it is the
document's next piece. The deltas of a document concatenate to its translation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from seq2serve.runtime.frontend.documents.piece_batch import PieceBatch
from seq2serve.runtime.frontend.documents.pieces import Piece


@dataclass
class DocumentEvent:
    index: int  # the document
    delta: str
    finished: bool  # the document's last delta


@dataclass
class DocumentStream:
    documents: list[str]
    pieces: list[list[Piece]]
    batch: PieceBatch
    encode: Callable[[str], str]
    _texts: list[str] = field(init=False)  # per source: its translation so far
    _done: list[bool] = field(init=False)
    _next: list[int] = field(init=False)  # per document: its first piece not yet done
    _sent: list[int] = field(init=False)  # per document: offset sent up to (structure)
    _sent_text: list[int] = field(init=False)  # characters of its next piece's text sent
    _users: list[list[int]] = field(init=False)

    def __post_init__(self) -> None:
        n = len(self.batch.sources)
        self._texts, self._done = [""] * n, [False] * n
        self._next = [0] * len(self.documents)
        self._sent = [0] * len(self.documents)
        self._sent_text = [0] * len(self.documents)
        self._users = self.batch.users()

    def start(self) -> list[DocumentEvent]:
        """What can be sent before any translation: each document's structure up to its first
        piece, and whole the documents that have nothing to translate."""
        return [e for d in range(len(self.documents)) if (e := self._advance(d)) is not None]

    def feed(self, source: int, delta: str, finished: bool) -> list[DocumentEvent]:
        """A source's next piece of translation (the last one with `finished`): the events
        it releases, at most one per document."""
        self._texts[source] += delta
        self._done[source] = self._done[source] or finished
        return [e for d in self._users[source] if (e := self._advance(d)) is not None]

    def _advance(self, d: int) -> DocumentEvent | None:
        doc, pieces, slots = self.documents[d], self.pieces[d], self.batch.slots[d]
        if self._next[d] > len(pieces):
            return None  # finished before
        out = []
        while self._next[d] < len(pieces):
            piece, k = pieces[self._next[d]], slots[self._next[d]]
            out.append(doc[self._sent[d]:piece.start])
            self._sent[d] = piece.start
            text = self._texts[k]
            out.append(self.encode(text[self._sent_text[d]:]))
            self._sent_text[d] = len(text)
            if not self._done[k]:
                break
            self._next[d] += 1
            self._sent[d], self._sent_text[d] = piece.end, 0
        finished = self._next[d] == len(pieces)
        if finished:
            out.append(doc[self._sent[d]:])
            self._sent[d] = len(doc)
            self._next[d] += 1  # past the end: nothing more to send
        delta = "".join(out)
        return DocumentEvent(d, delta, finished) if delta or finished else None
