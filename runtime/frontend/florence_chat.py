"""A chat request to a model whose encoder reads an image and then a task prompt (Florence-2:
`frontend_info`'s `image_prompt`) as the /generate request it stands for.

Florence-2 has no chat template and no conversation: it answers one task about one image. So
a chat request is one user message whose content holds one image part (OpenAI's `image_url`,
as for Mllama) and text parts that make the task prompt (`<CAPTION>`, `<OD>`,
`<CAPTION_TO_PHRASE_GROUNDING>` and its phrase, or free text, which HF's processor passes as
it is). The text goes to the runtime as /generate's `text`, where the task token becomes its
prompt (`image_prompts.task_prompt`) and the answer is parsed (`florence_answers.py`). A
system or developer message, several messages, no image, several images, no text or an
unknown task token is a `ChatTaskError` naming the field.
"""

from __future__ import annotations

from typing import Any

from seq2serve.runtime.frontend.image_prompts import task_prompt
from seq2serve.runtime.frontend.prompts import content_parts

_SHAPE = "one user message with one image part and a task token (e.g. <CAPTION>) as its text"


class ChatTaskError(ValueError):
    """A chat request Florence-2 cannot answer: a 400 naming `param`."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def task_request(messages: list[dict[str, Any]], info: dict[str, Any]) -> dict[str, Any]:
    """The chat `messages` (as the template would get them: role and content) as generate's
    {"text": the task prompt as written, "image_data": [the image]}."""
    roles = [m.get("role") for m in messages]
    if roles != ["user"]:
        other = next((r for r in roles if r != "user"), None)
        why = (f"a {other} message" if other is not None
               else f"{len(messages)} user messages")
        raise ChatTaskError(f"this model (Florence-2) answers {_SHAPE}, not a conversation: "
                            f"got {why}", "messages")
    images: list[Any] = []
    try:
        parts = content_parts(messages[0].get("content"), 0, images)
    except ValueError as e:
        raise ChatTaskError(str(e), "messages.0.content") from None
    if len(images) != 1:
        raise ChatTaskError(f"this model (Florence-2) reads one image per request: "
                            f"messages.0.content has {len(images)} image parts ({_SHAPE})",
                            "messages.0.content")
    text = "".join(p["text"] for p in parts if p["type"] == "text").strip()
    if not text:
        raise ChatTaskError(f"messages.0.content has no text: this model (Florence-2) needs "
                            f"a task token such as <CAPTION> or <OD> ({_SHAPE})",
                            "messages.0.content")
    try:
        task_prompt(text, info)  # an unknown or misplaced task token: refused here, by field
    except ValueError as e:
        raise ChatTaskError(f"messages.0.content: {e}", "messages.0.content") from None
    return {"text": text, "image_data": images}
