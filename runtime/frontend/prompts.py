"""Prompt templates: translation and chat, for models with and without their own templates."""

from __future__ import annotations

import json
import os
from typing import Any

import jinja2

T5_TRANSLATION_TEMPLATE = "translate {source_lang} to {target_lang}: {text}"
TEMPLATE_FILE = "seq2serve.json"  # optional, in the model directory: {"translation_template": …}


def translation_prompt(model_path: str, text: str, source_lang: str, target_lang: str) -> str:
    """The model directory's template when it has one (seq2serve.json), else T5's convention."""
    template = T5_TRANSLATION_TEMPLATE
    path = os.path.join(model_path, TEMPLATE_FILE)
    if os.path.isfile(path):
        with open(path) as f:
            template = json.load(f).get("translation_template", template)
    return template.format(source_lang=source_lang, target_lang=target_lang, text=text)


def chat_prompt(tokenizer, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Render chat messages as generate's input.

    With a chat template: {"input_ids", "image_data"} (the template writes the special tokens
    and an <|image|> per image part; `tools`, OpenAI's function tools, go to it as HF's
    `apply_chat_template` takes them). Without one: {"text"}, each message's text on its own
    line (roles dropped), which suits text-to-text models. Image parts may be OpenAI's
    {"type": "image_url", "image_url": {"url": ...}} or {"type": "image", "image": <any image
    input>}. A template that refuses the messages (its `raise_exception`) is a ValueError.
    """
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    rendered, images = [], []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"messages[{i}] must have 'role' and 'content'")
        rendered.append({**m, "content": content_parts(m["content"], i, images)})
    if getattr(tokenizer, "chat_template", None):
        try:
            text = tokenizer.apply_chat_template(rendered, tools=tools, tokenize=False,
                                                 add_generation_prompt=True)
        except jinja2.TemplateError as e:
            raise ValueError(f"the model's chat template refused these messages: {e}") from None
        return {"input_ids": tokenizer(text, add_special_tokens=False).input_ids,
                "image_data": images}
    if images:
        raise ValueError("this model takes no images (it has no chat template for them)")
    return {"text": "\n".join(_plain(m["content"]) for m in rendered)}


ROLES = ("system", "user", "assistant")
_PLAIN_ROLE = ("", "\n")  # no template: a message is its text on a line of its own
_MARK = "\x00seq2serve-content\x00"


def role_markers(tokenizer) -> dict[str, tuple[str, str]]:
    """Each role's text before and after a message's content, as the tokenizer's chat template
    writes a message that follows a user turn (so without the template's BOS). Without a
    template, or for a role the template refuses or shapes otherwise: ("", "\n"), the plain
    join of `chat_prompt`."""
    template = getattr(tokenizer, "chat_template", None)
    markers = {}
    for role in ROLES:
        markers[role] = _PLAIN_ROLE
        if not template:
            continue
        try:
            first = [{"role": "user", "content": "hi"}]
            before = tokenizer.apply_chat_template(first, tokenize=False)
            after = tokenizer.apply_chat_template(first + [{"role": role, "content": _MARK}],
                                                  tokenize=False)
        except Exception:  # noqa: BLE001 - a template may raise on role order: plain then
            continue
        if after.startswith(before) and after.count(_MARK) == 1:
            begin, end = after[len(before):].split(_MARK)
            markers[role] = (begin, end)
    return markers


def content_parts(content: Any, i: int, images: list) -> str | list[dict[str, Any]]:
    """Normalize messages[i]'s content: its image parts' sources are appended to `images` and
    become {"type": "image"} placeholders; a malformed part is a ValueError naming it."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"messages[{i}].content must be a string or a list of parts")
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            parts.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "image_url":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            if not isinstance(url, str):
                raise ValueError(f"messages[{i}].content[{j}].image_url.url must be a string")
            images.append(url)
            parts.append({"type": "image"})
        elif kind == "image" and "image" in part:
            images.append(part["image"])
            parts.append({"type": "image"})
        else:
            raise ValueError(f"messages[{i}].content[{j}]: unsupported part type {kind!r}")
    return parts


def _plain(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "".join(p["text"] for p in content if p["type"] == "text")
