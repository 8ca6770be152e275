"""What the encoder stage consumes: a request's encoder inputs (segments). A segment is a key, a
token count and its data: token ids for text encoders, or a model-owned payload (Mllama: a
preprocessed image, `ImageFeatures`) that the runtime moves and caches without looking in."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from seq2serve.encoders.pixel_store import read_pixels, read_pixels_into
from seq2serve.models.device_copy import to_device


class EncoderPayload(Protocol):
    """A model-owned encoder input (not text). The scheduler knows only its key, its length
    and whether its data can be had; the encoder stage batches payloads through their type."""

    key: str  # content hash: equal keys, equal encoder outputs
    num_tokens: int  # cross K/V tokens of its encoder output

    @property
    def has_data(self) -> bool:
        """Whether its data can still be read (else only a cached output can serve it)."""

    @property
    def host_data(self) -> torch.Tensor | None:
        """Its data where the request carries it (None: in a `PixelStore` file already)."""

    def stored(self, path: str) -> EncoderPayload:
        """The same input with its data left in a `PixelStore` file at `path`."""

    @classmethod
    def batch(cls, payloads: list, pin: bool = False) -> Any:
        """One encode batch of several payloads (with `.to(device)`), as the model reads it;
        `pin`: its large host tensors page-locked (the device is a GPU: `to_device` then
        queues their copy without another host copy)."""


@dataclass
class ImageFeatures:
    """One image, preprocessed by the checkpoint's image processor (set by the tokenizer
    manager). Its cross K/V are `num_tokens` long: only the real tiles are kept.

    Between processes the pixels travel as a file of the tokenizer manager's `PixelStore`
    (`stored`): the request carries the file's name, and the scheduler reads it only if its
    encoder cache misses."""

    pixel_values: torch.Tensor | None = field(repr=False)  # [max_tiles, C, H, W]
    aspect_ratio_id: int
    num_tiles: int
    num_tokens: int
    key: str  # content hash of model, image bytes and processor settings
    pixel_file: str | None = None  # the PixelStore file holding the pixels
    pixel_layout: tuple | None = None  # (dtype, shape) of that file's pixels

    @property
    def has_data(self) -> bool:
        return self.pixel_values is not None or (
            self.pixel_file is not None and os.path.exists(self.pixel_file))

    @property
    def host_data(self) -> torch.Tensor | None:
        """The pixels, where the request itself carries them (what a store would keep)."""
        return self.pixel_values

    def stored(self, path: str) -> ImageFeatures:
        """The same image with its pixels left in a PixelStore file at `path`."""
        px = self.pixel_values
        return dataclasses.replace(self, pixel_values=None, pixel_file=path,
                                   pixel_layout=(px.dtype, tuple(px.shape)))

    def pixels(self) -> torch.Tensor:
        if self.pixel_values is not None:
            return self.pixel_values
        return read_pixels(self.pixel_file, *self.pixel_layout)

    @property
    def pixel_shape(self) -> tuple[tuple[int, ...], torch.dtype]:
        """(shape, dtype) of its pixels, without reading them."""
        if self.pixel_values is not None:
            return tuple(self.pixel_values.shape), self.pixel_values.dtype
        dtype, shape = self.pixel_layout
        return tuple(shape), dtype

    def pixels_into(self, out: torch.Tensor) -> None:
        """Write its pixels into `out` (a batch's slot of its shape and dtype)."""
        if self.pixel_values is not None:
            out.copy_(self.pixel_values)
        else:
            read_pixels_into(self.pixel_file, out)

    @classmethod
    def batch(cls, payloads: list[ImageFeatures], pin: bool = False) -> ImageBatch:
        return ImageBatch.of(payloads, pin)


@dataclass
class ImageBatch:
    """The images of one ENCODE batch, stacked (padded tiles included, as the tower expects)."""

    pixel_values: torch.Tensor  # [images, max_tiles, C, H, W]
    aspect_ratio_ids: torch.Tensor  # [images]
    num_tiles: list[int]

    @classmethod
    def of(cls, images: list[ImageFeatures], pin: bool = False) -> ImageBatch:
        return cls(pixel_values=stacked_pixels(images, pin),
                   aspect_ratio_ids=torch.tensor([i.aspect_ratio_id for i in images]),
                   num_tiles=[i.num_tiles for i in images])

    def to(self, device: str) -> ImageBatch:
        return ImageBatch(to_device(self.pixel_values, device),
                          self.aspect_ratio_ids.to(device, non_blocking=True), self.num_tiles)


def stacked_pixels(images: list[ImageFeatures], pin: bool = False) -> torch.Tensor:
    """The images' pixels stacked [images, ...], each file read straight into its slot; in
    page-locked memory with `pin` (the encoder is on a GPU), so that `to_device` queues the
    batch's copy without another host copy. (Reading, stacking and pinning one after another
    cost four copies of every image on the scheduler's thread: florence-2-large's 3.5 MB
    images, 0.34 s of 256 images' encoder stage on an H200, benchmarks.md.)"""
    shape, dtype = images[0].pixel_shape
    for i, image in enumerate(images):
        if image.pixel_shape != (shape, dtype):
            raise ValueError(f"image {i} of an encoder batch is {image.pixel_shape}, the "
                             f"first {(shape, dtype)}: one batch holds one size")
    out = torch.empty((len(images), *shape), dtype=dtype, pin_memory=pin)
    for image, slot in zip(images, out):
        image.pixels_into(slot)
    return out


def cross_spans(token_ids: list[int], image_token_id: int,
                image_tokens: list[int]) -> list[tuple[int, int, int]]:
    """Which cross K/V each decoder position may read, as HF's Mllama processor defines it.

    Images are packed in order; image i occupies `image_tokens[i]` keys. A run of consecutive
    `<|image|>` tokens forms a group that later text attends to together, until the next
    group; image i of a group becomes visible at its own token. Returns spans
    (first position, kv_start, kv_end): a position reads the span with the largest first
    position at or before it; positions before the first image read nothing.
    """
    locs = [p for p, t in enumerate(token_ids) if t == image_token_id]
    if len(locs) != len(image_tokens):
        raise ValueError(f"the prompt has {len(locs)} <|image|> token(s) but "
                         f"{len(image_tokens)} image(s) were given")
    spans, offset, group_start = [], 0, 0
    for i, loc in enumerate(locs):
        if i == 0 or loc != locs[i - 1] + 1:
            group_start = offset
        offset += image_tokens[i]
        spans.append((loc, group_start, offset))
    return spans


def span_at(spans: list[tuple[int, int, int]], position: int) -> tuple[int, int]:
    """The (kv_start, kv_end) a decoder position reads under `spans` ((0, 0): nothing)."""
    best = (0, 0)
    for first, start, end in spans:
        if first > position:
            break
        best = (start, end)
    return best


@dataclass
class EncoderSegment:
    """One encoder input of a request (its text, or one image); its output is one encoder
    cache entry. Requests with several images have several segments, packed in order."""

    key: str  # content hash (model + input)
    length: int  # cross K/V tokens
    token_ids: list[int] | None = None  # a text encoder's input
    payload: EncoderPayload | None = None  # a model-owned input (Mllama: an image)

    @property
    def missing_data(self) -> bool:
        """Its data can no longer be read: only a cached encoder output can serve it."""
        return self.payload is not None and not self.payload.has_data
