"""The checkpoint's Hugging Face image processor, turning a PIL image into ImageFeatures."""

from __future__ import annotations

import json

from seq2serve.encoders.encoder_input import ImageFeatures
from seq2serve.encoders.image_loader import image_key


class ImageProcessor:
    def __init__(self, model_path: str, model_id: str, tokens_per_tile: int) -> None:
        from transformers import AutoImageProcessor

        try:
            self.hf = AutoImageProcessor.from_pretrained(model_path)
        except (OSError, ValueError) as e:
            raise ValueError(f"no image processor in {model_path!r} "
                             f"(preprocessor_config.json): {e}") from None
        self.model_id = model_id
        self.tokens_per_tile = tokens_per_tile
        self.settings = json.dumps(self.hf.to_dict(), sort_keys=True, default=str)

    def __call__(self, image, ident: bytes) -> ImageFeatures:
        out = self.hf(images=[[image.convert("RGB") if image.mode != "RGB" else image]],
                      return_tensors="pt")
        num_tiles = int(out["num_tiles"][0][0])
        return ImageFeatures(
            pixel_values=out["pixel_values"][0, 0].float().contiguous(),
            aspect_ratio_id=int(out["aspect_ratio_ids"][0, 0]),
            num_tiles=num_tiles,
            num_tokens=num_tiles * self.tokens_per_tile,
            key=image_key(self.model_id, ident, self.settings),
        )
