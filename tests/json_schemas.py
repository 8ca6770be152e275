"""JSON Schemas of real-world shapes for the grammar tests, generated from a seed: objects
nested two deep, arrays, enums, `anyOf`, `const`, string formats (uuid, ipv6) and patterns
(codes, dates), bounded numbers, optional properties and `additionalProperties: false`
everywhere (OpenAI's strict mode).

Every string has a `maxLength` or a format and every array a `maxItems`: a random model, which
the tests decode with, never closes a free string or array on its own (it picks among tens of
thousands of allowed tokens, of which a few end the value).
"""

from __future__ import annotations

import random
from typing import Any

WORDS = ["id", "name", "city", "kind", "tags", "price", "count", "owner", "status", "items",
         "created", "email", "address", "score", "enabled", "notes", "level", "code", "host",
         "zip", "unit", "rank", "color", "lang"]
ENUMS = [["red", "green", "blue"], ["open", "closed"], ["low", "mid", "high"], ["EUR", "USD"],
         [1, 2, 3], ["a", "b", "c", "d"], [True, None]]
# formats whose text is bounded and that jsonschema's FormatChecker checks without extras.
# Not the others: xgrammar's patterns for them are looser than the RFCs, so a valid decoding
# can fail the check (date: "9904-06-31"; time: unbounded fractions, offsets the checker
# refuses; ipv4: leading zeros, "010.1.1.1"), or unbounded (email)
FORMATS = ["uuid", "ipv6"]


def leaf(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["string", "integer", "number", "boolean", "null", "enum", "format",
                       "const", "anyOf", "pattern"])
    if kind == "string":
        return {"type": "string", "minLength": rng.choice([0, 1]),
                "maxLength": rng.randint(2, 8)}
    if kind == "integer":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 500)}
    if kind == "number":
        return {"type": "number", "minimum": -10, "maximum": 10}
    if kind in ("boolean", "null"):
        return {"type": kind}
    if kind == "enum":
        return {"enum": rng.choice(ENUMS)}
    if kind == "format":
        return {"type": "string", "format": rng.choice(FORMATS)}
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice([r"^[A-Z]{2}-[0-9]{2,4}$",
                                                         r"^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"])}
    if kind == "const":
        return {"const": rng.choice(["v1", 7, False])}
    return {"anyOf": [leaf(rng), leaf(rng)]}


def array(rng: random.Random, depth: int) -> dict[str, Any]:
    items = obj(rng, depth + 1) if depth < 2 and rng.random() < 0.3 else leaf(rng)
    lo = rng.choice([0, 1])
    return {"type": "array", "items": items, "minItems": lo, "maxItems": lo + rng.randint(1, 3)}


def obj(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    names = rng.sample(WORDS, rng.randint(1, 4 if depth else 5))
    props: dict[str, Any] = {}
    for name in names:
        r = rng.random()
        if depth < 2 and r < 0.2:
            props[name] = obj(rng, depth + 1)
        elif r < 0.4:
            props[name] = array(rng, depth)
        else:
            props[name] = leaf(rng)
    required = [n for n in names if rng.random() < 0.7] or names[:1]
    return {"type": "object", "properties": props, "required": required,
            "additionalProperties": False}


def schemas(count: int = 200, seed: int = 41) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        if i % 10 == 9:  # a top-level array or anyOf now and then
            out.append(array(rng, 0) if i % 20 == 9 else {"anyOf": [obj(rng, 1), obj(rng, 1)]})
        else:
            out.append(obj(rng))
    return out
