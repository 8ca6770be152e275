"""`RuntimeEndpoint("http://host:port")`: programs run on a `seq2serve serve` server over
HTTP (`/generate`, `/tokenize`, `/get_model_info`). Images are sent as data URLs (local files
and PIL images are encoded here, so the server needs no access to them)."""

from __future__ import annotations

import base64
import io
import json
import os
from collections.abc import Iterator
from typing import Any

import httpx

from seq2serve.lang.backend import Backend


class RuntimeEndpoint(Backend):
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # one client for every program thread (httpx.Client is thread-safe); enough
        # connections for a run_batch's concurrent requests
        self.client = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout,
                                   limits=httpx.Limits(max_connections=256,
                                                       max_keepalive_connections=64))

    def close(self) -> None:
        self.client.close()

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        r = self.client.post(path, json=body)
        if r.status_code != 200:
            raise ValueError(f"{path}: HTTP {r.status_code}: {_error_message(r)}")
        return r.json()

    def _encode(self, body: dict[str, Any]) -> dict[str, Any]:
        if "image_data" not in body:
            return body
        data = body["image_data"]
        if body.get("input_ids") is not None or isinstance(body.get("text"), list):
            data = [[_data_url(img) for img in imgs] for imgs in data]  # one list per prompt
        else:
            data = [_data_url(img) for img in data]
        return {**body, "image_data": data}

    def _generate(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        out = self._post("/generate", self._encode(body))
        return out if isinstance(out, list) else [out]

    def _stream(self, body: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        sent = 0  # each event carries the text so far
        with self.client.stream("POST", "/generate", json=self._encode(body)) as r:
            if r.status_code != 200:
                r.read()
                raise ValueError(f"/generate: HTTP {r.status_code}: {_error_message(r)}")
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data: "):])
                if "error" in event:
                    raise ValueError(f"/generate: {event['error'].get('message', event)}")
                text = event["text"]
                yield text[sent:], event["meta_info"]
                sent = len(text)

    def _tokenize(self, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        return self._post("/tokenize", {"prompt": texts,
                                        "add_special_tokens": add_special_tokens})["tokens"]

    def _model_info(self) -> dict[str, Any]:
        r = self.client.get("/get_model_info")
        if r.status_code != 200:
            raise ValueError(f"/get_model_info: HTTP {r.status_code}: {_error_message(r)}")
        return r.json()


def _error_message(r: httpx.Response) -> str:
    try:
        return r.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return r.text[:500]


def _data_url(image: Any) -> Any:
    """A PIL image, bytes or a local file as a data URL; other strings (URLs, base64) as is."""
    if isinstance(image, str) and not os.path.isfile(image):
        return image
    if isinstance(image, str):
        with open(image, "rb") as f:
            image = f.read()
    if not isinstance(image, (bytes, bytearray)):  # a PIL image
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        image = buf.getvalue()
    return "data:image/png;base64," + base64.b64encode(bytes(image)).decode()
