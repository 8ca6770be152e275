"""Per-request slot tables: decoder position -> KV slot, and encoder position -> cross K/V slot."""

from __future__ import annotations

import numpy as np
import torch

from seq2serve.runtime.memory.device_log import DeviceLog


class ReqToTokenPool:
    """`req_to_token[i, p]` is the TokenToKVPool slot of decoder position p of the request in
    row i; `req_to_cross[i, j]` is the CrossKVPool slot of its encoder position j. Rows are
    handed out by `alloc` and owned by one request until `free`. Attention kernels read these
    tables directly, so a batch needs no per-step page-table rebuild.
    """

    def __init__(self, size: int, max_context_len: int, max_encoder_len: int, device: str):
        self.size = size
        self.max_context_len = max_context_len
        self.max_encoder_len = max_encoder_len
        # one extra row, never handed out: padded entries of a CUDA graph batch use it (its
        # slots are 0, the KV pools' scratch page)
        self.dummy_row = size
        self.req_to_token = torch.zeros((size + 1, max_context_len), dtype=torch.int32,
                                        device=device)
        self.req_to_cross = torch.zeros(
            (size + 1, max(max_encoder_len, 1)), dtype=torch.int32, device=device
        )
        self._free = list(range(size - 1, -1, -1))
        self._free_set = set(self._free)  # (the double-free check without a walk of the list)
        self.log: DeviceLog | None = None  # tensor parallelism: the writes to replay elsewhere

    def write(self, table: str, row: int, values: torch.Tensor) -> None:
        """Positions [0, len(values)) of `row` of `table` ("req_to_token", "req_to_cross")."""
        if self.log is not None:
            self.log.record("req_to_token", "write", table, row, values)
        t = getattr(self, table)
        t[row, : values.numel()] = values.to(t.device, non_blocking=True)

    def write_rows(self, table: str, rows: list[int], values: list[torch.Tensor]) -> None:
        """`write(table, rows[i], values[i])` for every i, as one copy to the device and one
        indexed write (a step's admissions: one each was a copy and a kernel a request)."""
        if not rows:
            return
        if self.log is not None:
            self.log.record("req_to_token", "write_rows", table, rows, values)
        t = getattr(self, table)
        lengths = np.fromiter(map(torch.Tensor.numel, values), dtype=np.int64, count=len(rows))
        starts = np.cumsum(lengths) - lengths
        cols = np.arange(int(lengths.sum())) - np.repeat(starts, lengths)
        # (row, column, value) of every entry, one host tensor: one copy to the device, which
        # does not wait for the step in flight (a blocking copy synchronizes the stream)
        packed = torch.stack([torch.from_numpy(np.repeat(np.asarray(rows), lengths)),
                              torch.from_numpy(cols), torch.cat(values).long()])
        packed = packed.to(t.device, non_blocking=True)
        t[packed[0], packed[1]] = packed[2].to(t.dtype)

    def copy_rows(self, table: str, src: list[int], dst: list[int]) -> None:
        """Rows `src` of `table` copied to rows `dst` (the gather copies before the scatter)."""
        if self.log is not None:
            self.log.record("req_to_token", "copy_rows", table, src, dst)
        t = getattr(self, table)
        # (indices uploaded without waiting: a CUDA tensor indexed by host lists copies them
        # with a blocking copy, which waits for the step in flight)
        idx = torch.tensor([src, dst], dtype=torch.int64).to(t.device, non_blocking=True)
        t[idx[1]] = t[idx[0]]

    def scatter(self, rows: list[int], positions: list[int], slots: list[int]) -> None:
        """req_to_token[rows[i], positions[i]] = slots[i]."""
        if self.log is not None:
            self.log.record("req_to_token", "scatter", rows, positions, slots)
        t = self.req_to_token
        packed = torch.tensor([rows, positions, slots], dtype=torch.int64).to(t.device,
                                                                              non_blocking=True)
        t[packed[0], packed[1]] = packed[2].to(t.dtype)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self) -> int | None:
        if not self._free:
            return None
        idx = self._free.pop()
        self._free_set.discard(idx)
        return idx

    def free(self, idx: int) -> None:
        assert idx not in self._free_set, f"request slot {idx} freed twice"
        self._free.append(idx)
        self._free_set.add(idx)

    def check(self, owned: list[int]) -> None:
        if self._free_set != set(self._free) or len(self._free_set) != len(self._free):
            raise AssertionError("request slots: the free list and its set differ")
        everything = sorted(self._free + owned)
        if everything != list(range(self.size)):
            raise AssertionError(
                f"request slots: {len(self._free)} free + {len(owned)} owned != {self.size}"
            )
