"""Whether a model's vocabulary can write what a JSON schema requires: a sound check.

A schema's `required_chars` are characters every JSON text valid under it contains: an
object's braces, an array's brackets, a string's quotes, and what a required property or a
non-empty array's items require (`anyOf` / `oneOf` / a list of types: what every branch
requires; `allOf`: what any part requires). Where a character could be escaped or the
schema is not understood (`$ref`, `not`, `if`), nothing is claimed. A character of that set
that no token contains means no output of the model can be valid: the schema is refused.
(T5's and mT5's vocabularies have no `{` or `}`: no object can be written, while arrays,
enums and regexes can.) What this check cannot see, a grammar that reaches a state where no
token is allowed, the scheduler stops at run time (`RowGrammar.dead_end`).
"""

from __future__ import annotations

from typing import Any

_STRUCTURE = {"object": "{}", "array": "[]", "string": '"'}


def required_chars(schema: Any) -> set[str]:
    if not isinstance(schema, dict):
        return set()
    if "const" in schema:
        return _value_chars(schema["const"])
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return _common([_value_chars(v) for v in schema["enum"]])
    parts = [_of_type(schema, t) for t in _types(schema)]
    need = _common(parts) if parts else set()
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            need |= _common([required_chars(b) for b in branches])
    for part in schema.get("allOf") or []:
        need |= required_chars(part)
    return need


def missing_chars(schema: Any, vocabulary: frozenset[str]) -> list[str]:
    """The characters `schema` requires that no token of the vocabulary contains."""
    return sorted(required_chars(schema) - vocabulary)


def _types(schema: dict) -> list[str]:
    t = schema.get("type")
    if isinstance(t, str):
        return [t]
    if isinstance(t, list):
        return [x for x in t if isinstance(x, str)]
    if "properties" in schema or "required" in schema:
        return ["object"]
    if "items" in schema or "prefixItems" in schema:
        return ["array"]
    return []


def _of_type(schema: dict, kind: str) -> set[str]:
    need = set(_STRUCTURE.get(kind, ""))
    if kind == "object":
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        required = [p for p in schema.get("required") or [] if isinstance(p, str)]
        if required:
            need |= {'"', ":"}
        for name in required:
            need |= required_chars(props.get(name))
    elif kind == "array" and _int(schema.get("minItems")) > 0:
        prefix = schema.get("prefixItems")
        need |= required_chars(prefix[0] if isinstance(prefix, list) and prefix
                               else schema.get("items"))
    return need


def _value_chars(value: Any) -> set[str]:
    """Characters the JSON text of `value` contains whichever way it is written."""
    if isinstance(value, dict):
        need = set("{}")
        for v in value.values():
            need |= {'"', ":"} | _value_chars(v)
        return need
    if isinstance(value, list):
        need = set("[]")
        for v in value:
            need |= _value_chars(v)
        return need
    return {'"'} if isinstance(value, str) else set()


def _common(sets: list[set[str]]) -> set[str]:
    return set.intersection(*sets) if sets else set()


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
