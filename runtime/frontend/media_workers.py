"""Images decoded and preprocessed in worker processes (`--media-processes N`), instead of
the tokenizer manager's media threads.

The threads share one interpreter (the Python and array work of an image processor holds the
GIL) and torch's intra-op threads: on a 16-core GPU host 4, 8 or 16 media threads all made
florence-2-large's 768x768 images at ~5.2 ms an image against 12.1 ms on one
(`benchmarks/frontend_image_cost.py`, benchmarks.md; which of the two holds them is not
measured yet). Each worker (`media_worker.py`) has its own interpreter, processor and memo,
and one torch thread; the parent sends it a source (a URL, bytes, a path or a PIL image) and
gets the `ImageFeatures` back, their pixels left in a file in host memory (the pixel store's
folder) and read back (through the pipe they cost a few ms an image more). A task goes to the
worker with the fewest in flight. A worker that dies fails the tasks it held with a clear
error and is started again; one that cannot start fails the engine's start with its
reason."""

from __future__ import annotations

import dataclasses
import fcntl
import itertools
import logging
import os
import pickle
import queue
import subprocess
import sys
import threading
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any

from seq2serve.encoders.pixel_store import read_pixels

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0
WORKER_MEMO = 8  # recent images a worker keeps preprocessed
PIPE_BYTES = 1 << 20


def send(conn: Connection, obj: Any) -> None:
    """`obj` pickled by the standard pickler (a Connection's own would share a tensor's
    storage through multiprocessing's resource sharer, which these processes, not started by
    multiprocessing, cannot reach)."""
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def recv(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


def _received(features, file, size) -> tuple:
    """(features, size) with the pixels the worker left in `file` read back (and the file
    removed)."""
    if file is None:  # (they came in the reply)
        return features, size
    path, dtype, shape = file
    try:
        pixels = read_pixels(path, dtype, shape)
    finally:
        os.unlink(path)
    return dataclasses.replace(features, pixel_values=pixels), size


def _widen(fd: int) -> None:
    """The pipe's buffer at up to 1 MiB (Linux; 64 KiB by default): an image's encoded bytes
    cross in a few writes, not in dozens of switches between the processes."""
    try:
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    except OSError:
        pass


def _settle(future: Future | None, result: Any = None,
            error: BaseException | None = None) -> None:
    """A task's answer to its future, unless it has none or was cancelled (its caller
    stopped waiting: an earlier image of its call was refused)."""
    if future is None or not future.set_running_or_notify_cancel():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class MediaWorkerError(RuntimeError):
    """A media worker failed on an input for a reason other than the input (it died, or its
    processor raised other than a ValueError)."""


class _Worker:
    def __init__(self, config: dict[str, Any]) -> None:
        task_r, task_w = os.pipe()
        result_r, result_w = os.pipe()
        _widen(task_w)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        # (out of the terminal's process group: a Ctrl-C reaches the server, which closes its
        # workers, not each worker, whose death the server would then answer with another)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "seq2serve.runtime.frontend.media_worker", str(task_r),
             str(result_w)], pass_fds=(task_r, result_w), stdin=subprocess.DEVNULL, env=env,
            start_new_session=True)
        os.close(task_r)
        os.close(result_w)
        self.tasks = Connection(task_w, readable=False)
        self.results = Connection(result_r, writable=False)
        self.pending: dict[int, Future] = {}
        self.reading = False  # a reader thread owns `results` (and closes it)
        send(self.tasks, config)
        # (tasks are sent from a thread of the worker's own: a send blocks while the worker
        # is busy and its pipe full, and other workers' tasks must not wait behind it)
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._send_tasks, daemon=True,
                         name=f"seq2serve-media-sender-{self.proc.pid}").start()

    def _send_tasks(self) -> None:
        """(This thread alone writes to and closes `tasks`: a pipe closed under a blocked
        write could see its number reused by another file.)"""
        while (item := self.outbox.get()) is not None:
            task_id, src = item
            try:
                send(self.tasks, item)
            except Exception as e:  # noqa: BLE001 - the future says it
                # (it died: its reader replaces it; or the source does not pickle)
                _settle(self.pending.pop(task_id, None),
                        error=MediaWorkerError(f"a media worker did not take an image ({e})"))
            del item, src
        self.tasks.close()

    def wait_ready(self, timeout: float) -> None:
        """The worker's ready report; MediaWorkerError if it exits or is silent first."""
        if not self.results.poll(timeout):
            self.kill()
            raise MediaWorkerError(f"a media worker did not start within {timeout:.0f} s")
        try:
            recv(self.results)
        except (EOFError, OSError):
            self.kill()
            raise MediaWorkerError(f"a media worker exited at start (code "
                                   f"{self.proc.returncode}; its error is above, on "
                                   f"stderr)") from None

    def kill(self) -> None:
        """Ends the process; its pipes then end, and the threads that own them close them."""
        self.outbox.put(None)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if not self.reading:
            self.results.close()


class MediaWorkers:
    def __init__(self, count: int, processor: dict[str, Any], policy, with_size: bool,
                 folder: str) -> None:
        """`count` workers, each with an `ImageProcessor(**processor)`; `policy`: the
        MediaPolicy sources are read under; `with_size`: each result carries the image's
        (width, height) (Florence-2's answers), else None; `folder`: where the workers leave
        the pixels for the parent to read (in host memory: the PixelStore's folder)."""
        os.makedirs(folder, exist_ok=True)
        # (each worker's memo of recent images is smaller than the threads' one: a repeated
        # image finds its worker's memo only when it lands on the same worker)
        self.config = {"processor": {"memo_size": WORKER_MEMO, **processor}, "policy": policy,
                       "with_size": with_size, "folder": folder}
        self.ready = threading.Condition()
        self.ids = itertools.count()
        self.closed = False
        self.broken: str | None = None  # why no worker is left, if none could be started
        self.restarting = 0
        self.workers: list[_Worker] = []  # the live ones
        try:
            self.workers = [_Worker(self.config) for _ in range(count)]
            for w in self.workers:  # (they start side by side: each imports torch)
                w.wait_ready(START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise
        for w in self.workers:
            self._read_in_background(w)

    @property
    def pids(self) -> list[int]:
        with self.ready:
            return [w.proc.pid for w in self.workers]

    def close(self) -> None:
        with self.ready:
            self.closed = True
            workers, self.workers = self.workers, []
            self.ready.notify_all()
        for w in workers:
            w.kill()
            self._fail(w, "the media workers were closed")

    def submit(self, src) -> Future:
        """A future of the source's (ImageFeatures, size or None); it raises ValueError with
        the processor's message for a bad input, MediaWorkerError for anything else."""
        future: Future = Future()
        with self.ready:
            # (while a dead worker's replacement starts and no other is left, tasks wait)
            self.ready.wait_for(lambda: self.workers or self.closed or self.broken
                                or not self.restarting, timeout=START_TIMEOUT_S)
            if self.closed or not self.workers:
                raise MediaWorkerError(self.broken or "the media workers are closed")
            worker = min(self.workers, key=lambda w: len(w.pending))
            task_id = next(self.ids)
            worker.pending[task_id] = future
        worker.outbox.put((task_id, src))
        return future

    # --- inside --------------------------------------------------------------------------------
    def _read_in_background(self, worker: _Worker) -> None:
        worker.reading = True
        threading.Thread(target=self._read, args=(worker,), daemon=True,
                         name=f"seq2serve-media-reader-{worker.proc.pid}").start()

    def _read(self, worker: _Worker) -> None:
        while True:
            try:
                task_id, status, value = recv(worker.results)
            except Exception:  # noqa: BLE001 - it exited, or broke the protocol: replaced
                worker.results.close()
                break
            future = worker.pending.pop(task_id, None)
            if status == "ok":
                try:
                    result = _received(*value)  # (its file removed even if none waits)
                except (OSError, ValueError) as e:
                    _settle(future, error=MediaWorkerError(f"an image's pixels were lost "
                                                           f"between processes: {e}"))
                else:
                    _settle(future, result)
            elif status == "refused":
                _settle(future, error=ValueError(value))
            else:
                _settle(future, error=MediaWorkerError(f"the image processor failed: {value}"))
        self._replace(worker)

    def _replace(self, worker: _Worker) -> None:
        """A worker that died (or was closed): out of the live ones at once, its tasks
        failed, a new one started in its place."""
        with self.ready:
            live = worker in self.workers
            if live:
                self.workers.remove(worker)
                self.restarting += 1
        code = worker.proc.poll()
        if code is None:
            worker.kill()
            code = worker.proc.returncode
        self._fail(worker, f"a media worker exited (code {code}) while preprocessing an image")
        if not live:  # (closed)
            return
        logger.error("media worker %d exited (code %s); starting another", worker.proc.pid, code)
        fresh, why = None, None
        try:
            fresh = _Worker(self.config)
            fresh.wait_ready(START_TIMEOUT_S)
        except (MediaWorkerError, OSError) as e:
            logger.error("a new media worker did not start: %s", e)
            fresh, why = None, str(e)
        with self.ready:
            self.restarting -= 1
            if fresh is not None and not self.closed:
                self.workers.append(fresh)
            elif fresh is not None:
                fresh.kill()
                fresh = None
            elif not self.workers and not self.restarting:
                self.broken = f"no media worker is left: {why}"
            self.ready.notify_all()
        if fresh is not None:
            self._read_in_background(fresh)

    @staticmethod
    def _fail(worker: _Worker, reason: str) -> None:
        for task_id in list(worker.pending):
            _settle(worker.pending.pop(task_id, None), error=MediaWorkerError(reason))
