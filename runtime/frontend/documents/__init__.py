"""Documents for translation (issue 42): plain text, markdown and HTML cut into the pieces a
model translates, and put back together byte for byte outside them.

The pipeline, one module a step: a format's scanner finds the document's text runs (prose;
everything else is structure: `markdown_blocks.py` and `markdown_inline.py`, `html_text.py`),
`sentences.py` cuts each run into sentences, `clauses.py` cuts a sentence longer than the
model's input limit at clause boundaries, `document_pieces.py` ties them together into
`Piece`s (`pieces.py`), `piece_batch.py` sends a request's repeated pieces once and
fans the translations back out, and `document_stream.py` streams each document in order.
Nothing here knows a model: the input limit comes in as a `fits(text)` predicate."""
