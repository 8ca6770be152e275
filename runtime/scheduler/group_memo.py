"""A value computed from a list of beam groups, kept while the same groups come again."""

from __future__ import annotations


class GroupMemo:
    """A value computed from a list of beam groups, kept while the same groups come again in
    the same order and (with a `book`) none has entered or left it meanwhile: a steady decode
    step's group columns are those of the step before. The check is one list comparison (by
    identity: groups compare so)."""

    def __init__(self, make, book=None) -> None:
        self.make, self.book = make, book
        self.groups: list | None = None
        self.version = -1
        self.value = None

    def __call__(self, groups: list):
        version = self.book.version if self.book is not None else 0
        if self.version != version or self.groups != groups:
            self.groups, self.version = list(groups), version
            self.value = self.make(groups)
        return self.value

    def clear(self) -> None:
        """Let go of the groups and the value (nothing runs: they are not held)."""
        self.groups, self.value, self.version = None, None, -1
