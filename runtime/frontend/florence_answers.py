"""Florence-2's answers to its task prompts, as HF's usage reads them: the tasks that locate
things (`<OD>`, `<OCR_WITH_REGION>`, `<CAPTION_TO_PHRASE_GROUNDING>`, ...) answer in special
tokens (`<loc_0>`..`<loc_999>`, `<poly>`, `<sep>`, ...) that a decode skipping special tokens
drops. HF decodes them with `skip_special_tokens=False` and parses the text with its
processor's `post_process_generation(text, task=..., image_size=(w, h))`.

For a request whose prompt is a task token, and which does not set `skip_special_tokens`,
the text keeps every special token but BOS, EOS and pad (decoded here, from the ids, with the
request's stop strings), and the result's `parsed` is HF's own `Florence2Processor`'s
`post_process_generation` of that text for the task and the image's size. A checkpoint whose
processor cannot be built (no processor files, no post-processor settings) gets the text
without `parsed`."""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass
from typing import Any

from PIL import Image

from seq2serve.runtime.frontend.incremental_detokenizer import IncrementalDetokenizer

logger = logging.getLogger(__name__)


def image_size(src: object, ident: bytes) -> tuple[int, int] | None:
    """(width, height) of an image as `read_image` returned it (`ident`: its encoded bytes,
    or a PIL image's pixels): read from the header only, nothing decoded."""
    if isinstance(src, Image.Image):
        return src.size
    try:
        with Image.open(io.BytesIO(ident)) as img:
            return img.size
    except Exception:  # noqa: BLE001 - the image processor reports undecodable images
        return None


@dataclass
class TaskAnswer:
    """One result's answer to a task: its text, decoded incrementally from its ids."""

    task: str
    image_size: tuple[int, int] | None
    detokenizer: IncrementalDetokenizer
    drop: frozenset[int]

    def add(self, ids: list[int], finished: bool, matched_stop: str | None) -> str:
        """The text the new ids add (every special token but BOS, EOS and pad)."""
        return self.detokenizer.add([t for t in ids if t not in self.drop], finished,
                                    matched_stop)


class FlorenceAnswers:
    """A Florence-2 checkpoint's task tokens, its tokenizer and (where its files allow) HF's
    `Florence2Processor`, whose `post_process_generation` parses an answer."""

    def __init__(self, tokenizer, info: dict[str, Any], processor=None) -> None:
        self.tokenizer = tokenizer
        self.tasks = [*info["task_prompts"], *info["task_prompts_with_input"]]
        self.processor = processor
        self.drop = frozenset(t for t in (tokenizer.bos_token_id, tokenizer.eos_token_id,
                                          tokenizer.pad_token_id) if t is not None)

    @classmethod
    def load(cls, model_path: str, tokenizer, info: dict[str, Any]) -> FlorenceAnswers:
        return cls(tokenizer, info, _processor(model_path))

    def task_of(self, text: str) -> str | None:
        """The task token of a prompt (`image_prompts.task_prompt` has checked its place),
        None for a prompt without one."""
        return next((t for t in self.tasks if t in text), None)

    def answer(self, task: str, size: tuple[int, int] | None,
               stop: list[str]) -> TaskAnswer:
        return TaskAnswer(task, size, IncrementalDetokenizer(self.tokenizer, False, stop),
                          self.drop)

    def parse(self, text: str, task: str, size: tuple[int, int] | None) -> dict | None:
        """HF's `post_process_generation(text, task=task, image_size=size)`; None without a
        processor (or where it fails: logged)."""
        if self.processor is None:
            return None
        try:
            return self.processor.post_process_generation(text, task=task, image_size=size)
        except Exception:  # noqa: BLE001 - the text answer stands without its parse
            logger.warning("Florence2Processor.post_process_generation failed for %s",
                           task, exc_info=True)
            return None


def _processor(model_path: str):
    """HF's Florence2Processor of the checkpoint, or None where it cannot be built or has no
    post-processor settings (its `post_processor_config`, which every parse needs)."""
    try:
        from transformers import Florence2Processor

        processor = Florence2Processor.from_pretrained(model_path)
    except Exception as e:  # noqa: BLE001 - no processor files: answers come unparsed
        logger.info("no Florence2Processor in %s (%s): answers come without `parsed`",
                    model_path, e)
        return None
    if not processor.post_processor.parse_task_config:
        logger.info("the Florence2Processor of %s has no post_processor_config: answers "
                    "come without `parsed`", model_path)
        return None
    return processor
