"""The checkpoint's Hugging Face image processor, turning a PIL image into ImageFeatures, with a
small memo so that a repeated image (chat turns, retries) skips preprocessing entirely."""

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

    def __init__(self, model_path: str, model_id: str, tokens_per_tile: int,
                 pixel_dtype: torch.dtype = torch.float32, memo_size: int = 32) -> None:
        from transformers import AutoImageProcessor

        try:
            self.hf = AutoImageProcessor.from_pretrained(model_path)
        except (OSError, ValueError) as e:
            raise ValueError(f"no image processor in {model_path!r} "
                             f"(preprocessor_config.json): {e}") from None
        self.model_id = model_id
        self.tokens_per_tile = tokens_per_tile
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
        out = self.hf(images=[[image.convert("RGB") if image.mode != "RGB" else image]],
                      return_tensors="pt")
        num_tiles = int(out["num_tiles"][0][0])
        features = ImageFeatures(
            pixel_values=out["pixel_values"][0, 0].to(self.pixel_dtype).contiguous(),
            aspect_ratio_id=int(out["aspect_ratio_ids"][0, 0]),
            num_tiles=num_tiles,
            num_tokens=num_tiles * self.tokens_per_tile,
            key=key,
        )
        with self.lock:
            self.memo[key] = features
            while len(self.memo) > self.memo_size:
                self.memo.popitem(last=False)
        return features
