"""SchedulerLink: the TokenizerManager's sending side to the scheduler, or, with data
parallelism (`--dp-size`), to each replica's scheduler through the `DataParallelRouter`.

With one scheduler it sends as before: a call's requests as one message, aborts to it, no
routing and no bookkeeping. With several, each request is routed on its own (a call's requests
that share a source or prompt meet on one replica through the router's affinity), each
replica gets its share of a call as one message, and the link remembers which replica holds
each result rid until the request ends, so that an abort goes where the request runs.
"""

from __future__ import annotations

import zmq

from seq2serve.runtime.config.server_args import CacheIsolation
from seq2serve.runtime.frontend.dp_router import DataParallelRouter, request_cost
from seq2serve.runtime.frontend.route_scopes import RouteScopes
from seq2serve.runtime.messages.io_struct import AbortRequest, ControlRequest, TokenizedRequest
from seq2serve.runtime.messages.ipc import socket


class SchedulerLink:
    def __init__(self, ctx: zmq.Context, endpoints: tuple[str, ...],
                 isolation: CacheIsolation | None = None) -> None:
        self._attach([socket(ctx, zmq.PUSH, e, bind=False) for e in endpoints], isolation)

    @classmethod
    def over(cls, sockets: list, isolation: CacheIsolation | None = None) -> SchedulerLink:
        """A link over sockets already open (anything with `send_pyobj`: tests' wires)."""
        link = cls.__new__(cls)
        link._attach(list(sockets), isolation)
        return link

    def _attach(self, sockets: list, isolation: CacheIsolation | None) -> None:
        self.sockets = sockets
        self.router = DataParallelRouter(len(sockets)) if len(sockets) > 1 else None
        self.scopes = RouteScopes(isolation or CacheIsolation())
        self.replica_of: dict[str, int] = {}  # result rid -> its replica (several only)

    @property
    def replicas(self) -> int:
        return len(self.sockets)

    def send(self, reqs: list[TokenizedRequest]) -> None:
        """Send one call's requests (admitted together on each replica)."""
        if self.router is None:
            self.sockets[0].send_pyobj(reqs if len(reqs) > 1 else reqs[0])
            return
        shares: dict[int, list[TokenizedRequest]] = {}
        for r in reqs:
            lookup, record = self.scopes.keys(r)
            replica = self.router.route(lookup, request_cost(r), record)
            shares.setdefault(replica, []).append(r)
            for rid in r.result_rids:
                self.replica_of[rid] = replica
        for replica, share in shares.items():
            self.sockets[replica].send_pyobj(share if len(share) > 1 else share[0])

    def finished(self, reqs: list[TokenizedRequest]) -> None:
        """The call's requests ended (finished, failed or aborted): their load comes off."""
        if self.router is None:
            return
        for r in reqs:
            replica = None
            for rid in r.result_rids:
                replica = self.replica_of.pop(rid, replica)
            if replica is not None:
                self.router.release(replica, request_cost(r))

    def abort(self, rid: str) -> None:
        """Abort on the replica that holds `rid` (every replica when none is known: the
        scheduler ignores an rid it does not have)."""
        replica = self.replica_of.get(rid)
        targets = self.sockets if replica is None else [self.sockets[replica]]
        for s in targets:
            s.send_pyobj(AbortRequest(rid))

    def control(self, replica: int, msg: ControlRequest) -> None:
        self.sockets[replica].send_pyobj(msg)

    def close(self) -> None:
        for s in self.sockets:
            s.close()
