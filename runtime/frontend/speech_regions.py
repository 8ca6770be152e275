"""Where speech is in 16 kHz audio, by Silero VAD (`silero-vad`, MIT: its 2 MB TorchScript
model ships in the package), for `chunking_strategy` (`chunking_strategy.py`).

It runs on the CPU, in the frontend's process, beside the audio decoding (off the event loop
for HTTP: the default executor's threads), never on the GPU: one LSTM step per 32 ms frame
(512 samples), about 1.5 s of one CPU core per minute of audio (an AMD EPYC core; 0.2 s
more, once per thread, to load the model). The
model keeps its LSTM state between calls, so each thread loads its own copy (0.2 s, once).

Torch's intra-op threads are 1 while any detection runs (the process's count is put back
when the last one ends): the model's ops are tiny, and a second thread made it 13x slower on
a busy 2-core host (10 s of audio: 13 s against 0.8 s). Importing `silero_vad` sets 1 for
good (its `model.py` does so); the count is put back after the import.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import numpy as np

from seq2serve.runtime.frontend.chunking_strategy import VadOptions

SAMPLING_RATE = 16_000
MAX_REGION_S = 30.0  # Whisper's window: longer speech is cut at its longest inner silence

_local = threading.local()
_import_lock = threading.Lock()
_threads_lock = threading.Lock()
_running = [0, 0]  # detections running now, the process's torch thread count before them


def speech_regions(samples: np.ndarray, options: VadOptions) -> list[tuple[int, int]]:
    """The speech regions of 16 kHz mono samples as [start, end) sample pairs in order (each
    padded by `prefix_padding_ms`, at most 30 s), as `silero_vad.get_speech_timestamps`
    returns them with `options`' settings."""
    import torch

    get_speech_timestamps, model = _silero()
    audio = torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32))
    with _one_torch_thread():
        found = get_speech_timestamps(audio, model, sampling_rate=SAMPLING_RATE,
                                      max_speech_duration_s=MAX_REGION_S,
                                      **options.silero_kwargs())
    return [(int(r["start"]), int(r["end"])) for r in found]


@contextmanager
def _one_torch_thread():
    """Torch's intra-op threads at 1 while any caller is inside (counted across threads)."""
    import torch

    with _threads_lock:
        if _running[0] == 0:
            _running[1] = torch.get_num_threads()
            torch.set_num_threads(1)
        _running[0] += 1
    try:
        yield
    finally:
        with _threads_lock:
            _running[0] -= 1
            if _running[0] == 0:
                torch.set_num_threads(_running[1])


def _silero():
    """(get_speech_timestamps, this thread's model)."""
    model = getattr(_local, "model", None)
    if model is None:
        with _import_lock:
            import torch

            threads = torch.get_num_threads()
            try:
                from silero_vad import get_speech_timestamps, load_silero_vad
            except ImportError as e:
                raise RuntimeError("chunking_strategy needs the silero-vad package (pip "
                                   "install silero-vad)") from e
            finally:
                torch.set_num_threads(threads)  # silero_vad sets 1 at import
            model = _local.model = load_silero_vad()
            _local.get_speech_timestamps = get_speech_timestamps
    return _local.get_speech_timestamps, model
