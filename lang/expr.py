"""What a program appends to its state: text, `gen`, `select`, images and chat roles, and their
concatenations (`"Q: " + gen("a")`). Building one runs nothing; the state's executor runs it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class Expr:
    """A part of a program; `a + b` (either may be a str) is the two in order."""

    def __add__(self, other: Any) -> Seq:
        return Seq([self, as_expr(other)])

    def __radd__(self, other: Any) -> Seq:
        return Seq([as_expr(other), self])


@dataclass
class Text(Expr):
    text: str


@dataclass
class Seq(Expr):
    parts: list[Expr]


@dataclass
class Gen(Expr):
    """Generate from the state: the decoder continues the prompt (decoder-only models) or
    decodes from the state as its encoder input (encoder-decoder models)."""

    name: str | None
    sampling_params: dict[str, Any]


@dataclass
class Select(Expr):
    """Score each choice as the continuation (decoder-only) or as the whole decoder output
    (encoder-decoder: the choice's tokens with its end token) and append the best one."""

    name: str | None
    choices: list[str]
    choices_method: str  # "sum" (of the choice tokens' log-probs) or "mean" (per token)


@dataclass
class Image(Expr):
    image: Any  # a path, bytes, base64, a data URL or a PIL image


@dataclass
class Role(Expr):
    role: str  # "system" | "user" | "assistant"
    content: Expr | None = None  # None: only the role's beginning (then `role_end`)


@dataclass
class RoleEnd(Expr):
    role: str


@dataclass
class Flat:
    """One step of the executor: the flattened form of an expression."""

    kind: str  # "text" | "image" | "gen" | "select" | "role_begin" | "role_end"
    value: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


def as_expr(x: Any) -> Expr:
    if isinstance(x, Expr):
        return x
    if isinstance(x, str):
        return Text(x)
    raise TypeError(f"a program appends str or gen/select/image/role expressions, not "
                    f"{type(x).__name__}")


def flatten(x: Any) -> list[Flat]:
    """The steps of an expression, in order."""
    x = as_expr(x)
    if isinstance(x, Text):
        return [Flat("text", x.text)] if x.text else []
    if isinstance(x, Seq):
        return [step for part in x.parts for step in flatten(part)]
    if isinstance(x, Role):
        if x.content is None:
            return [Flat("role_begin", x.role)]
        return [Flat("role_begin", x.role), *flatten(x.content), Flat("role_end", x.role)]
    if isinstance(x, RoleEnd):
        return [Flat("role_end", x.role)]
    if isinstance(x, Image):
        return [Flat("image", x.image)]
    if isinstance(x, Gen):
        return [Flat("gen", x)]
    if isinstance(x, Select):
        return [Flat("select", x)]
    raise TypeError(f"unknown expression {x!r}")


# --- the constructors a program uses -------------------------------------------------------
_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
             "repetition_penalty", "ignore_eos", "stop_token_ids", "seed", "min_new_tokens")


def gen(name: str | None = None, max_tokens: int = 128, stop: str | list[str] | None = None,
        temperature: float | None = None, regex: str | None = None,
        json_schema: str | None = None, **sampling: Any) -> Gen:
    """Generate text into `s[name]`. `temperature` 0 is greedy (unset: the runtime's default,
    1.0); other sampling parameters by SGLang's names (top_p, top_k, seed, ...). `regex` or
    `json_schema` (a JSON Schema as text) constrain the output (the runtime's grammar
    backend; a grammar it cannot compile, or the model's vocabulary cannot write, is a
    ValueError naming it)."""
    unknown = sorted(set(sampling) - set(_SAMPLING))
    if unknown:
        raise ValueError(f"gen: unknown sampling parameter(s) {', '.join(unknown)}")
    params: dict[str, Any] = {"max_new_tokens": max_tokens, **sampling}
    if stop is not None:
        params["stop"] = stop
    if temperature is not None:
        params["temperature"] = temperature
    if regex is not None:
        params["regex"] = regex
    if json_schema is not None:
        params["json_schema"] = json_schema
    return Gen(name, params)


def select(name: str | None = None, choices: list[str] | None = None,
           choices_method: str = "sum") -> Select:
    """Append the choice the model scores best into `s[name]`: by the sum of its tokens'
    log-probabilities ("sum") or their mean ("mean"). Every choice's scores are in
    `s.get_meta_info(name)`."""
    if not isinstance(choices, list) or not choices:
        raise ValueError("select needs a non-empty list of choices")
    for i, c in enumerate(choices):
        if not isinstance(c, str) or not c:
            raise ValueError(f"select: choices[{i}] must be a non-empty string")
    if choices_method not in ("sum", "mean"):
        raise ValueError(f'select: choices_method must be "sum" or "mean", got '
                         f"{choices_method!r}")
    return Select(name, list(choices), choices_method)


def image(source: Any) -> Image:
    """An image at this point of the prompt (vision models: Mllama's <|image|>)."""
    return Image(source)


def system(content: Any = None) -> Expr:
    return Role("system", None if content is None else as_expr(content))


def user(content: Any = None) -> Expr:
    return Role("user", None if content is None else as_expr(content))


def assistant(content: Any = None) -> Expr:
    return Role("assistant", None if content is None else as_expr(content))


def system_end() -> Expr:
    return RoleEnd("system")


def user_end() -> Expr:
    return RoleEnd("user")


def assistant_end() -> Expr:
    return RoleEnd("assistant")
