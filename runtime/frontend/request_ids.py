"""Request ids as clients name them (`rid`) and as the runtime keys them: under their user.

Every request is keyed by (user, rid), so two users' rids never meet: one user cannot abort
another's request by its rid, and the "rid must be unique" refusal says nothing about other
users' requests (two users may run the same rid at once). Requests without a user share one
anonymous namespace, as in the caches. The key is the user's length, the user, then the rid
(`5:alice:r1`): no pair of a user and a rid can spell another pair's key, and a suffix added to
the key (`-0`, a sample's) is a suffix of the rid.
"""

from __future__ import annotations


def scoped_rid(user: str | None, rid: str) -> str:
    """The runtime's key of `rid` sent by `user`."""
    user = user or ""
    return f"{len(user)}:{user}:{rid}"


def client_rid(scoped: str) -> str:
    """The rid the client named (or was given), from the runtime's key."""
    length, rest = scoped.split(":", 1)
    return rest[int(length) + 1:]
