"""Request fields this server knows but does not implement: each is refused with a 400 that
names it, unless its value asks for nothing the server lacks (null, or OpenAI's default).

No field is silently ignored: the request bodies (`openai_protocol.py`) refuse unknown fields
(`extra="forbid"`), and a field they declare only to refuse it carries a `Refused` rule in the
body's `REFUSED` table. README.md ("OpenAI fields") lists what is honoured and what is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

TOOL_CHOICE = ('"auto", "none", "required" or a named function ({"type": "function", '
               '"function": {"name": ...}}); for allowed_tools, send only the allowed tools')
STRICT = ("the arguments of a call the model chooses to make (tool_choice \"auto\") are not "
          "constrained; force the call with tool_choice \"required\" or a named function, and "
          "its arguments follow the tool's schema")
FUNCTIONS = ("the deprecated functions API is not implemented: send tools and tool_choice "
             "instead")


@dataclass(frozen=True)
class Refused:
    """`why` the field is refused; `accepts`: the values that ask for nothing this server lacks
    (compared with their type: `0` is not `false`), or a test of (value, body)."""

    why: str
    accepts: tuple[Any, ...] | Callable[[Any, Any], bool] = (None,)

    def refuses(self, value: Any, body: Any) -> bool:
        if callable(self.accepts):
            return not self.accepts(value, body)
        return not any(value is ok or (type(value) is type(ok) and value == ok)
                       for ok in self.accepts)


def first_refusal(body: BaseModel, path: str = "") -> tuple[str, str] | None:
    """The first field of `body`, or of a body inside it (a message, the stream options), that
    its `REFUSED` table refuses: (the field's path as `param`, e.g. "messages.0.name", why)."""
    for name, rule in getattr(body, "REFUSED", {}).items():
        if rule.refuses(getattr(body, name), body):
            return path + name, rule.why
    for name, value in body:
        if isinstance(value, BaseModel):
            found = first_refusal(value, f"{path}{name}.")
        elif isinstance(value, list) and value and isinstance(value[0], BaseModel):
            found = next(filter(None, (first_refusal(v, f"{path}{name}.{i}.")
                                       for i, v in enumerate(value))), None)
        else:
            continue
        if found:
            return found
    return None
