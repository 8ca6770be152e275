"""Where the pixels of images in flight live between the tokenizer manager and the scheduler.

One mechanism, one owner: the tokenizer manager writes each preprocessed image once, to a
file in host shared memory (`/dev/shm` when it has room, else the temporary directory), and
every request carries only the file's name. The scheduler reads a file only when its encoder
cache misses (a new image, or one evicted since), so a repeated image costs no copy and no
round trip, and nothing mirrors what the scheduler holds. A file stays while a request that
uses it is unfinished (pinned), then up to `budget_bytes` of unpinned files are kept, least
recently used first, for repeats. The folder goes when the store is closed; one left by a
process that was killed is removed by the next store created on the host.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections import OrderedDict

import torch


class PixelStore:
    def __init__(self, budget_bytes: int = 256 << 20, root: str | None = None) -> None:
        parent = root or _default_dir() or tempfile.gettempdir()
        _remove_orphans(parent)
        self.root = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=parent)
        self.budget_bytes = budget_bytes
        self.pins: dict[str, int] = {}  # key -> unfinished requests using it
        self.unpinned: OrderedDict[str, int] = OrderedDict()  # key -> bytes, LRU first
        self.unpinned_bytes = 0
        self.sizes: dict[str, int] = {}

    def path(self, key: str) -> str:
        return os.path.join(self.root, key)

    def put(self, key: str, pixels: torch.Tensor) -> str:
        """Pin `key` for one more request (writing its pixels if absent); its file's path."""
        if key in self.unpinned:
            self.unpinned_bytes -= self.unpinned.pop(key)
        if key not in self.sizes:
            data = pixels.contiguous().view(torch.uint8).numpy()
            tmp = self.path(key) + ".part"
            try:
                with open(tmp, "wb") as f:
                    f.write(memoryview(data))
            except OSError:  # no room: leave nothing behind
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
            os.replace(tmp, self.path(key))  # readers never see a half-written file
            self.sizes[key] = data.nbytes
        self.pins[key] = self.pins.get(key, 0) + 1
        return self.path(key)

    def release(self, key: str) -> None:
        """A request using `key` finished; unpinned files over the budget are deleted."""
        left = self.pins.get(key, 0) - 1
        if left > 0:
            self.pins[key] = left
            return
        self.pins.pop(key, None)
        if key not in self.sizes:
            return
        self.unpinned[key] = self.sizes[key]
        self.unpinned_bytes += self.sizes[key]
        while self.unpinned_bytes > self.budget_bytes:
            old, size = self.unpinned.popitem(last=False)
            self.unpinned_bytes -= size
            self.sizes.pop(old, None)
            try:
                os.unlink(self.path(old))
            except FileNotFoundError:
                pass

    @property
    def num_files(self) -> int:
        return len(self.sizes)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def read_pixels(path: str, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """The pixels a PixelStore file holds (FileNotFoundError if it was deleted); a -1 in
    `shape` takes what the file's size leaves (an audio window's samples: (-1,))."""
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        count = os.path.getsize(path) // dtype.itemsize // max(known, 1)
        shape = tuple(count if d == -1 else d for d in shape)
    out = torch.empty(shape, dtype=dtype)
    read_pixels_into(path, out)
    return out


def read_pixels_into(path: str, out: torch.Tensor) -> None:
    """Fill the contiguous host tensor `out` with the pixels a PixelStore file holds, read
    straight into it: one copy from the page cache (a batch's slot, pinned, is then copied
    to the GPU as it is). FileNotFoundError if the file was deleted; ValueError if it does
    not hold exactly `out`'s bytes."""
    buf = memoryview(out.view(-1).view(torch.uint8).numpy())
    filled = 0
    with open(path, "rb", buffering=0) as f:
        while filled < len(buf):
            n = f.readinto(buf[filled:])
            if not n:
                break
            filled += n
        extra = f.read(1)
    if filled != len(buf) or extra:
        raise ValueError(f"the pixel file {path} does not hold the {len(buf)} bytes of its "
                         f"image ({tuple(out.shape)}, {out.dtype})")


_PREFIX = "seq2serve-pixels-"


def _remove_orphans(parent: str) -> None:
    """Delete the folders of stores whose process is gone (killed before closing)."""
    for name in os.listdir(parent):
        if not name.startswith(_PREFIX):
            continue
        pid = name[len(_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _default_dir() -> str | None:
    """/dev/shm when it exists and has room for a few large images (containers often give it
    64 MB), else the temporary directory."""
    try:
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize >= 1 << 30:
            return "/dev/shm"
    except OSError:
        pass
    return None
