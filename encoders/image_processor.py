"""The checkpoint's Hugging Face image processor, turning a PIL image into ImageFeatures, with a
small memo so that a repeated image (chat turns, retries) skips preprocessing entirely.

Two layouts: Mllama's tiles (`tokens_per_tile` each), or one image whose token count follows
its processed size through a model's patch convolutions (`stages`: Florence-2's)."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable

import torch
from PIL import Image

from seq2serve.encoders.encoder_input import ImageFeatures
from seq2serve.encoders.image_loader import image_key


class ImageProcessor:
    """Thread-safe: the tokenizer manager preprocesses a request's images concurrently."""

    def __init__(self, model_path: str, model_id: str, tokens_per_tile: int | None,
                 pixel_dtype: torch.dtype = torch.float32, memo_size: int = 32,
                 stages: list | None = None, extra_tokens: int = 0,
                 max_grid: int | None = None) -> None:
        from transformers import AutoImageProcessor

        try:
            self.hf = AutoImageProcessor.from_pretrained(model_path)
        except (OSError, ValueError) as e:
            raise ValueError(f"no image processor in {model_path!r} "
                             f"(preprocessor_config.json): {e}") from None
        self.model_id = model_id
        self.tokens_per_tile = tokens_per_tile
        # the one-image layout's: patch convolutions, tokens besides the grid's, grid limit
        self.stages, self.extra_tokens, self.max_grid = stages, extra_tokens, max_grid
        self.pixel_dtype = pixel_dtype  # the model's: half the bytes to ship in bf16
        self.settings = json.dumps(self.hf.to_dict(), sort_keys=True, default=str)
        self.memo: OrderedDict[str, ImageFeatures] = OrderedDict()
        self.memo_size = memo_size
        self.lock = threading.Lock()

    def __call__(self, ident: bytes, decode: Callable[[], Image.Image]) -> ImageFeatures:
        """Features of the image identified by `ident`; `decode` runs only on a memo miss."""
        key = image_key(self.model_id, ident, self.settings)
        with self.lock:
            if key in self.memo:
                self.memo.move_to_end(key)
                return self.memo[key]
        image = decode()
        image = image.convert("RGB") if image.mode != "RGB" else image
        features = (self._tiled(image, key) if self.stages is None
                    else self._single(image, key))
        with self.lock:
            self.memo[key] = features
            while len(self.memo) > self.memo_size:
                self.memo.popitem(last=False)
        return features

    def _tiled(self, image: Image.Image, key: str) -> ImageFeatures:
        out = self.hf(images=[[image]], return_tensors="pt")
        num_tiles = int(out["num_tiles"][0][0])
        return ImageFeatures(
            pixel_values=out["pixel_values"][0, 0].to(self.pixel_dtype).contiguous(),
            aspect_ratio_id=int(out["aspect_ratio_ids"][0, 0]),
            num_tiles=num_tiles,
            num_tokens=num_tiles * self.tokens_per_tile,
            key=key,
        )

    def _single(self, image: Image.Image, key: str) -> ImageFeatures:
        pixels = self.hf(images=[image], return_tensors="pt")["pixel_values"][0]
        h, w = feature_grid(pixels.shape[-2:], self.stages)
        if self.max_grid is not None and max(h, w) > self.max_grid:
            raise ValueError(f"the processed image ({pixels.shape[-2]}x{pixels.shape[-1]}) "
                             f"leaves a {h}x{w} feature grid, past the model's {self.max_grid} "
                             f"grid positions (vision_config.max_position_embeddings)")
        return ImageFeatures(pixel_values=pixels.to(self.pixel_dtype).contiguous(),
                             aspect_ratio_id=0, num_tiles=1,
                             num_tokens=h * w + self.extra_tokens, key=key)


def feature_grid(size: tuple[int, int], stages: list) -> tuple[int, int]:
    """(rows, columns) of the feature grid an image of `size` (height, width) leaves after
    convolutions of (kernel, stride, padding) `stages`."""
    h, w = size
    for kernel, stride, padding in stages:
        h = (h + 2 * padding - kernel) // stride + 1
        w = (w + 2 * padding - kernel) // stride + 1
    return h, w
