"""Translation's beam count: CTranslate2's `beam_size` or HF's `num_beams` (one option, two
names), by default the model directory's generation_config.json `num_beams`."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from seq2serve.runtime.config.sampling_params import MAX_BEAMS

logger = logging.getLogger(__name__)

GENERATION_CONFIG = "generation_config.json"


def default_num_beams(model_path: str) -> int:
    """generation_config.json's `num_beams`, else 1. Read once at start-up: a malformed file
    or value is logged and ignored."""
    path = os.path.join(model_path, GENERATION_CONFIG)
    if not os.path.isfile(path):
        return 1
    try:
        with open(path) as f:
            beams = json.load(f).get("num_beams", 1)
    except (OSError, ValueError, AttributeError) as e:  # unreadable, not JSON, not an object
        logger.warning("%s is unreadable (%s); translations default to 1 beam", path, e)
        return 1
    if isinstance(beams, bool) or not isinstance(beams, int) or not 1 <= beams <= MAX_BEAMS:
        logger.warning("%s: num_beams %r is not an integer in [1, %d]; translations default "
                       "to 1 beam", path, beams, MAX_BEAMS)
        return 1
    return beams


def with_beams(params: dict[str, Any] | None, beam_size: int | None, default: int,
               stream: bool = False) -> dict[str, Any]:
    """A translation's sampling params with `num_beams` settled: `beam_size` or the params'
    own `num_beams` (both given: equal), else `default`. A stream cannot wait for a beam
    search's end, so it does not take the default: it decodes greedily unless told."""
    if params is not None and not isinstance(params, dict):
        raise ValueError(f"sampling_params must be a dict (one for every text), got "
                         f"{type(params).__name__}")
    params = dict(params or {})
    given = params.get("num_beams")
    if beam_size is not None and given is not None and beam_size != given:
        raise ValueError(f"beam_size ({beam_size}) and num_beams ({given}) differ: they are "
                         f"the same option, give one")
    beams = beam_size if beam_size is not None else given
    if beams is None and not stream:
        beams = default
    if stream and isinstance(beams, int) and beams > 1:
        raise ValueError("stream cannot be combined with beam_size (num_beams) > 1: a beam "
                         "search result is known only when it ends")
    if beams is not None:
        params["num_beams"] = beams
    return params
