"""BatchChannel: rank 0 sends each step's message (the batch as the scheduler built it) to the
other tensor-parallel ranks.

A message is pickled once and broadcast over the CPU process group (gloo). Tensors on the
device (the overlap schedule's input tokens, the sampling batch's tensors, cached encoder
states) do not travel in the pickle: each is broadcast over the device group (NCCL on CUDA)
into a tensor of its shape that the receiver allocates on its own device, and the unpickled
message refers to that. Host tensors travel in the pickle.
"""

from __future__ import annotations

import io
import pickle

import torch
import torch.distributed as dist

from seq2serve.models.parallel_state import TensorParallel


class _Pickler(pickle.Pickler):
    def __init__(self, file, device_tensors: list[torch.Tensor]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.device_tensors = device_tensors

    def persistent_id(self, obj):
        if isinstance(obj, torch.Tensor) and obj.device.type != "cpu":
            self.device_tensors.append(obj)
            return len(self.device_tensors) - 1
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, device_tensors: list[torch.Tensor]) -> None:
        super().__init__(file)
        self.device_tensors = device_tensors

    def persistent_load(self, pid):
        return self.device_tensors[pid]


class BatchChannel:
    def __init__(self, tp: TensorParallel, device: str) -> None:
        self.tp, self.device = tp, device

    def send(self, message: object) -> None:
        """Rank 0: broadcast `message` to every other rank."""
        buf, tensors = io.BytesIO(), []
        _Pickler(buf, tensors).dump(message)
        specs = [(tuple(t.shape), t.dtype) for t in tensors]
        dist.broadcast_object_list([buf.getvalue(), specs], src=0, group=self.tp.cpu_group)
        for t in tensors:
            dist.broadcast(t.contiguous(), src=0, group=self.tp.group)

    def recv(self) -> object:
        """Ranks 1..N-1: the next message rank 0 sends (blocks until it comes)."""
        got: list = [None, None]
        dist.broadcast_object_list(got, src=0, group=self.tp.cpu_group)
        data, specs = got
        tensors = [torch.empty(shape, dtype=dtype, device=self.device) for shape, dtype in specs]
        for t in tensors:
            dist.broadcast(t, src=0, group=self.tp.group)
        return _Unpickler(io.BytesIO(data), tensors).load()
