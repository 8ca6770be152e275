"""One image and the prompt that follows it, as one encoder input (Florence-2: its encoder
reads the image's tokens, then the prompt's). The payload is an `ImageFeatures` (its pixels
travel and are cached as any image's) whose key and token count cover the prompt too, and
whose `batch` also packs the prompts' token ids."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

import torch

from seq2serve.encoders.encoder_input import ImageFeatures, stacked_pixels
from seq2serve.models.device_copy import to_device


@dataclass
class ImagePrompt(ImageFeatures):
    """`num_tokens`: the image's tokens plus the prompt's; `key`: of both."""

    prompt_ids: tuple[int, ...] = ()

    @classmethod
    def of(cls, image: ImageFeatures, prompt_ids: list[int]) -> ImagePrompt:
        h = hashlib.blake2b(digest_size=16)
        h.update(image.key.encode())
        h.update(b"\0prompt\0")
        h.update(",".join(map(str, prompt_ids)).encode())
        fields = {f.name: getattr(image, f.name) for f in dataclasses.fields(ImageFeatures)}
        fields.update(num_tokens=image.num_tokens + len(prompt_ids), key=h.hexdigest())
        return cls(**fields, prompt_ids=tuple(prompt_ids))

    @classmethod
    def batch(cls, payloads: list[ImagePrompt], pin: bool = False) -> ImagePromptBatch:
        return ImagePromptBatch(
            pixel_values=stacked_pixels(payloads, pin),
            token_ids=torch.tensor([t for p in payloads for t in p.prompt_ids]),
            text_lens=[len(p.prompt_ids) for p in payloads])


@dataclass
class ImagePromptBatch:
    """The images of one ENCODE batch, stacked (one size: the processor's), and their
    prompts' token ids, packed in the same order."""

    pixel_values: torch.Tensor  # [images, C, H, W]
    token_ids: torch.Tensor  # [prompt tokens]
    text_lens: list[int]

    def to(self, device: str) -> ImagePromptBatch:
        return ImagePromptBatch(to_device(self.pixel_values, device),
                                self.token_ids.to(device, non_blocking=True), self.text_lens)
