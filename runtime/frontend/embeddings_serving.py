"""/v1/embeddings (OpenAI's shape) for encoder-decoder text models: each input's encoder
output, the mean over all its tokens (EOS included), L2-normalised. The scheduler computes it
with the encoder stage, in the same batches and through the same encoder cache as every other
request (`TokenizedRequest.embed`: finished after its encoder pass, no decoder step), so a
source translated before costs no encoder pass. A decoder-only model (Llama) or a speech
model is a 400 naming it."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from fastapi import Request

from seq2serve.runtime.frontend.generate_request import GenerateReqInput
from seq2serve.runtime.frontend.openai_protocol import EmbeddingRequest
from seq2serve.runtime.frontend.openai_serving import OpenAIServing, text_or_ids


async def embeddings(serving: OpenAIServing, body: EmbeddingRequest,
                     request: Request) -> dict[str, Any]:
    serving.check_model(body.model)
    serving.refuse(body, "/v1/embeddings")
    text, input_ids = text_or_ids(body.input, "input")
    obj = GenerateReqInput(text=text, input_ids=input_ids, sampling_params={"max_new_tokens": 0},
                           embed=True, user=body.user)
    results = await serving.collect(obj, request)
    data = [{"object": "embedding", "index": i,
             "embedding": _encoded(r["meta_info"]["embedding"], body.encoding_format)}
            for i, r in enumerate(results)]
    tokens = sum(r["meta_info"]["prompt_tokens"] for r in results)
    return {"object": "list", "data": data, "model": serving.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def _encoded(vector: list[float], encoding_format: str) -> list[float] | str:
    """"float": the numbers; "base64": their float32 little-endian bytes (the openai client's
    default, which it decodes with numpy)."""
    if encoding_format == "float":
        return vector
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
