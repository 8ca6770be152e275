"""Prompt templates: translation and chat, for models with and without their own templates."""

from __future__ import annotations

import json
import os
from typing import Any

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


def chat_prompt(tokenizer, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Render chat messages as generate's input: {"input_ids": ...} through the tokenizer's
    chat template when it has one (the template writes the special tokens itself), else
    {"text": ...} with each message's text on its own line (roles dropped), which suits
    text-to-text models."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"messages[{i}] must have 'role' and 'content'")
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=True)
        return {"input_ids": tokenizer(text, add_special_tokens=False).input_ids}
    return {"text": "\n".join(_text_of(m["content"], i) for i, m in enumerate(messages))}


def _text_of(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise ValueError(f"messages[{i}].content: only text parts are supported here")
            parts.append(part.get("text", ""))
        return "".join(parts)
    raise ValueError(f"messages[{i}].content must be a string or a list of parts")
