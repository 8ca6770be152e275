"""Prompts of a model whose encoder reads an image and then a task prompt (Florence-2): the
task tokens (`<CAPTION>`, `<OD>`, ...) put in their prompts' place as HF's processor does
(the tables come with the scheduler's info: the model's `frontend_info`), and the prompt
packed with its image into one encoder input (`ImagePrompt`)."""

from __future__ import annotations

import re
from typing import Any

from seq2serve.encoders.encoder_input import ImageFeatures
from seq2serve.encoders.image_prompt import ImagePrompt

_TASK_TOKEN = re.compile(r"\s*(<[A-Z_]+>)")


def task_prompt(text: str, info: dict[str, Any]) -> str:
    """The prompt HF's processor makes of `text`: a task without input must be the whole
    text; a task with input takes the rest of the text as its input. A text that starts
    with an unknown task token is refused; other text passes as it is."""
    for token, prompt in info["task_prompts"].items():
        if token in text:
            if text != token:
                raise ValueError(f"the task token {token} must be the whole prompt "
                                 f"(got {text!r})")
            return prompt
    for token, prompt in info["task_prompts_with_input"].items():
        if token in text:
            return prompt.format(input=text.replace(token, "").strip())
    m = _TASK_TOKEN.match(text)
    if m:
        known = sorted([*info["task_prompts"], *info["task_prompts_with_input"]])
        raise ValueError(f"unknown task token {m[1]}; this model's tasks: {', '.join(known)}")
    return text


def task_prompt_ids(tokenizer, text: str, info: dict[str, Any]) -> list[int]:
    """The prompt's token ids after the image's: BOS, the task's prompt, EOS."""
    if tokenizer.bos_token is None or tokenizer.eos_token is None:
        raise ValueError("this model's tokenizer has no BOS or EOS token; its prompts are "
                         "BOS, the task's prompt, EOS (as HF's processor makes them)")
    prompt = tokenizer.bos_token + task_prompt(text, info) + tokenizer.eos_token
    return tokenizer(prompt, add_special_tokens=False).input_ids


def prompt_after_image(ids: list[int], images: list[ImageFeatures],
                       image_token_id: int) -> list[int]:
    """The prompt's ids without the image's placeholders: token ids as HF's processor gives
    them (the image's placeholder tokens first) or without them; one image per prompt."""
    if len(images) != 1:
        raise ValueError(f"this model reads one image per prompt (image_data): "
                         f"{len(images)} given")
    lead = next((i for i, t in enumerate(ids) if t != image_token_id), len(ids))
    if lead and lead != images[0].num_tokens:
        raise ValueError(f"the prompt starts with {lead} image placeholder tokens "
                         f"({image_token_id}); the image has {images[0].num_tokens}")
    if image_token_id in ids[lead:]:
        raise ValueError(f"image placeholder tokens ({image_token_id}) may only lead the "
                         f"prompt")
    return ids[lead:]


def pack(ids: list[int], images: list[ImageFeatures]) -> list[ImagePrompt]:
    """The request's one encoder input: its image, then its prompt."""
    return [ImagePrompt.of(images[0], ids)]
