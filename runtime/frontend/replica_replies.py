"""One answer from the replicas' answers to a control request (`--dp-size` > 1).

`stats`: counts summed over the replicas (largest-batch figures: the largest), the layout as
it is (`tp_size`: each replica's, not a sum; `dp_size`: the replicas; `tp_devices`: every
replica's devices), and each replica's own under "replicas" (with "replica": its index). `check_integrity`: ok when every
replica's pools are; an error names the replica. `flush_cache`: ok when every replica flushed.
"""

from __future__ import annotations

from typing import Any

from seq2serve.runtime.messages.io_struct import ControlReply


def merge_replies(kind: str, tag: str, replies: list[ControlReply]) -> ControlReply:
    ok = all(r.ok for r in replies)
    if kind == "stats":
        return ControlReply(kind, tag, ok, merge_stats([r.payload for r in replies]))
    payload: dict[str, Any] = {"replicas": [{"replica": i, "ok": r.ok, **r.payload}
                                            for i, r in enumerate(replies)]}
    errors = [f"replica {i}: {r.payload['error']}" for i, r in enumerate(replies)
              if not r.ok and "error" in r.payload]
    if errors:
        payload["error"] = "; ".join(errors)
    if kind == "check_integrity":
        payload["idle"] = all(r.payload.get("idle", False) for r in replies)
    return ControlReply(kind, tag, ok, payload)


def merge_stats(stats: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in stats[0]:
        values = [s.get(key) for s in stats]
        out[key] = _combine(key, values)
    if "tp_size" in out:  # every replica has the same ranks; summed they were dp x tp
        out["tp_size"] = max(s["tp_size"] for s in stats)
        out["tp_devices"] = [d for s in stats for d in s.get("tp_devices", [])]
    out["dp_size"] = len(stats)
    out["replicas"] = [{"replica": i, **s} for i, s in enumerate(stats)]
    return out


def _combine(key: str, values: list[Any]) -> Any:
    if all(_is_number(v) for v in values):
        return max(values) if key.startswith("max_") else sum(values)
    if all(isinstance(v, dict) for v in values):
        keys = {k for v in values for k in v}
        return {k: _combine(key, [v.get(k, 0) for v in values]) for k in sorted(keys)}
    return values[0]


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
