"""The grammar an OpenAI request asks for: `response_format` (a JSON object, a JSON Schema) or
SGLang's extra fields (`json_schema`, `regex`, `ebnf`), as the sampling parameter SGLang names
it. At most one per request; the scheduler compiles it (`runtime/grammar/`), and what it
refuses there (a bad schema, one the model's vocabulary cannot write) comes back as a 400
naming the field it came from (`named`)."""

from __future__ import annotations

import json
from typing import Any

from seq2serve.runtime.config.sampling_params import GRAMMAR_KINDS

# OpenAI's JSON mode: any object (the schema's own additionalProperties keeps xgrammar's
# strict mode from closing it)
JSON_OBJECT = json.dumps({"type": "object", "additionalProperties": True})


class GrammarFieldError(ValueError):
    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def grammar_fields(body) -> tuple[dict[str, str], str | None]:
    """({kind: text}, the field it came from), or ({}, None) without a grammar."""
    asked: list[tuple[str, dict[str, str]]] = []
    rf = body.response_format
    if rf is not None and rf.type == "json_object":
        asked.append(("response_format", {"json_schema": JSON_OBJECT}))
    elif rf is not None and rf.type == "json_schema":
        schema = rf.json_schema.schema_
        text = JSON_OBJECT if schema is None else json.dumps(schema)
        asked.append(("response_format", {"json_schema": text}))
    for name in GRAMMAR_KINDS:
        value: Any = getattr(body, name)
        if value is not None:
            asked.append((name, {name: value if isinstance(value, str) else json.dumps(value)}))
    if len(asked) > 1:
        raise GrammarFieldError(f"only one grammar per request, but "
                                f"{' and '.join(n for n, _ in asked)} were given", asked[1][0])
    return (asked[0][1], asked[0][0]) if asked else ({}, None)


def is_grammar_error(e: ValueError) -> bool:
    """Whether the scheduler refused the request's grammar (its messages name the kind)."""
    return str(e).startswith(GRAMMAR_KINDS)
