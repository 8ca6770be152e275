"""Request ids as clients name them (`rid`) and as the runtime keys them: under their user.

Every request is keyed by (user, rid), so two users' rids never meet: one user cannot abort
another's request by its rid, and the "rid must be unique" refusal says nothing about other
users' requests (two users may run the same rid at once). Requests without a user share one
anonymous namespace, as in the caches. The key is the user's length, the user, then the rid
(`5:alice:r1`): no pair of a user and a rid can spell another pair's key, and a suffix added to
the key (`-0`, a sample's) is a suffix of the rid.
"""

from __future__ import annotations


def scoped_rid(user: str | None, rid: str, server: int | None = None) -> str:
    """The runtime's key of `rid` sent by `user` (to HTTP process `server`, of several)."""
    user = user or ""
    key = f"{len(user)}:{user}:{rid}"
    return key if server is None else f"{server}/{key}"


def client_rid(scoped: str) -> str:
    """The rid the client named (or was given), from the runtime's key."""
    length, rest = scoped.split(":", 1)
    return rest[int(length.rpartition("/")[2]) + 1:]


def server_tag(tag: str, server: int | None) -> str:
    """A control request's tag as HTTP process `server` (of several) sends it."""
    return tag if server is None else f"{server}/{tag}"


def server_of(key: str) -> int:
    """The HTTP process a request key or control tag belongs to (0 without a prefix)."""
    head, sep, _ = key.partition("/")
    return int(head) if sep and head.isdigit() else 0
