"""A beam step's moves made on the device, so the next step can be launched before the host
has read this one (the overlap schedule).

From its second step on, a beam group's rows are `num_beams` decoder rows. Once the sampler's
rules (`beam_rules.py`) have chosen the running beams, `move_pages` makes each row continue
its parent: the table entries of the full pages are copied from the parent's row, and the
filled part of the parent's last page is copied into the row's own last page (each row of a
group owns a distinct last page, and keeps it). The host learns the same choices a step later
and only mirrors them in its books (`RequestMemory.follow_beams`); it allocates nothing for a
move.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class BeamMoves:
    """Per batch, for the groups past their first step (the scheduler builds it at launch).
    Groups come in the sampler's bucket order; rows of groups at their first step hold
    neutral values (they move nothing)."""

    table_rows: torch.Tensor  # [beam rows] int64: each row's req_to_token row
    shared_end: torch.Tensor  # [beam rows] int64: positions below it are in full pages
    copy_len: torch.Tensor  # [beam rows] int64: positions written in the last page
    copy_width: int  # max of copy_len, at least 1 (the width of the copy's index)
    # [groups + 1] int64: group g's beam rows are rows starts[g]:starts[g + 1] (None: the
    # copies take the torch path)
    starts: torch.Tensor | None = None
    max_beams: int = 1  # the most rows of a group (the kernel's tile)


def move_pages(req_to_token: torch.Tensor, kv, moves: BeamMoves, parents: torch.Tensor,
               kernel: bool | None = None) -> None:
    """Make each beam row continue its parent's sequence (see the module's docstring). Copies
    read the tables and K/V as they were before the step's moves (gather, then scatter). On
    CUDA the last pages' copies are one kernel that touches only the rows whose parent changed
    (`kernels/triton_beam_copy.py`); the table rows are rewritten after it has read them.
    `kernel` forces the choice (tests run the kernel in Triton's interpreter on the CPU)."""
    rows = moves.table_rows
    src_rows = rows[parents]
    own, theirs = req_to_token[rows], req_to_token[src_rows]
    ctx = req_to_token.shape[1]
    col = torch.arange(ctx, device=rows.device)
    shared = torch.where(col[None, :] < moves.shared_end[:, None], theirs, own)
    if kernel is None:
        kernel = rows.is_cuda and moves.starts is not None
    if kernel:
        # every tensor-parallel rank moves its own
        kv.copy_partial_pages(req_to_token, rows, parents, moves.shared_end, moves.copy_len,
                              moves.starts, moves.max_beams)
        req_to_token[rows] = shared
        return
    moved = src_rows != rows
    if not rows.is_cuda:  # a nonzero costs nothing here: copy only the rows that moved
        pick = moved.nonzero().squeeze(1)
        theirs, own, moved = theirs[pick], own[pick], moved[pick]
        shared_end, copy_len = moves.shared_end[pick], moves.copy_len[pick]
    else:  # (no host sync: every row, those that keep their parent copying slot 0 to 0)
        shared_end, copy_len = moves.shared_end, moves.copy_len
    width = torch.arange(moves.copy_width, device=rows.device)
    pos = (shared_end[:, None] + width[None, :]).clamp(max=ctx - 1)
    copy = (width[None, :] < copy_len[:, None]) & moved[:, None]
    # slots not to copy point at slot 0 (the pool's scratch page) on both sides
    src = torch.where(copy, theirs.gather(1, pos), 0).flatten().long()
    dst = torch.where(copy, own.gather(1, pos), 0).flatten().long()
    req_to_token[rows] = shared
    kv.copy_slots_local(src, dst)  # every tensor-parallel rank moves its own
