"""How many decoder and encoder tokens the pools hold: fixed at start from a memory budget."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

_CPU_BUDGET_CAP = 8 << 30  # CPU pools never plan past this many bytes


@dataclass(frozen=True)
class PoolPlan:
    max_total_tokens: int  # decoder self-attention KV slots
    max_cross_tokens: int  # cross-attention KV slots (0 for decoder-only models)
    budget_bytes: int


def available_bytes(device: str, mem_fraction: float) -> int:
    """Bytes the pools may take: `mem_fraction` of the device less what is already used."""
    if device.startswith("cuda"):
        free, total = torch.cuda.mem_get_info(torch.device(device))
        return int(free - (1.0 - mem_fraction) * total)
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        avail = info.get("MemAvailable", _CPU_BUDGET_CAP)
    except OSError:
        avail = _CPU_BUDGET_CAP
    return int(mem_fraction * min(avail, _CPU_BUDGET_CAP))


def plan_pools(*, budget_bytes: int, self_bytes_per_token: int, cross_bytes_per_token: int,
               max_running: int, context_len: int, max_encoder_len: int,
               cross_fraction: float | None, max_total_tokens: int | None,
               max_cross_tokens: int | None, page_size: int = 1) -> PoolPlan:
    """Split the budget between decoder KV and cross KV; explicit sizes win over the budget.
    The caps (every running request at its longest) count whole pages: a request's 1,500
    encoder positions take 94 pages of 16, 1,504 slots, and a cap of 1,500 a request held one
    request fewer than `max_running`."""
    self_cap = max_running * _whole_pages(context_len, page_size)
    cross_cap = (max_running * _whole_pages(max_encoder_len, page_size)
                 if cross_bytes_per_token else 0)
    if cross_fraction is None:
        # by what a long request of each kind would take (decoder length capped: long-context
        # models would otherwise starve the cross pool)
        want_self = min(context_len, 4096) * self_bytes_per_token
        want_cross = max_encoder_len * cross_bytes_per_token
        cross_fraction = want_cross / (want_self + want_cross) if want_cross else 0.0
    if max_total_tokens is None:
        max_total_tokens = min(self_cap, int(budget_bytes * (1 - cross_fraction)
                                             // max(self_bytes_per_token, 1)))
    if max_cross_tokens is None:
        max_cross_tokens = (min(cross_cap, int(budget_bytes * cross_fraction
                                               // cross_bytes_per_token))
                            if cross_bytes_per_token else 0)
    if max_total_tokens < 1 or (cross_bytes_per_token and max_cross_tokens < 1):
        raise ValueError(
            f"not enough memory for the KV pools ({budget_bytes / 2**30:.2f} GiB left after the "
            f"weights); raise mem_fraction or set max_total_tokens / max_cross_tokens"
        )
    return PoolPlan(max_total_tokens, max_cross_tokens, budget_bytes)


def _whole_pages(tokens: int, page_size: int) -> int:
    """`tokens` rounded up to whole pages of `page_size`."""
    return -(-tokens // page_size) * page_size
