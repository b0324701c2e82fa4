"""What a mode plans for a row's pass (`RowPlan`) and what it learns from the logits (`Outcome`): the two
types every mode (mars.decoding.modes, mars.decoding.tree) speaks."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

@dataclass
class RowPlan:
    # drafts or guesses fed as real tokens right after the row's real tokens, for the AR logits to check
    to_verify: list[int] = field(default_factory=list)
    groups: list[tuple[int, int]] = field(default_factory=list)  # (j, n): n masks that see the first j extras
    source: str | None = None  # where to_verify came from: "mars", "lookup" (verified), None (no drafts)
    to_verify_conf: list[float] | None = None  # the drafts' own confidences, where their source has them
    # to_verify as a tree (mars.decoding.tree): each draft's parent, -1 = the row's last real token; None = a chain.
    # Group (j, n) then sits after draft j-1 and sees its ancestors (masks.window_mask)
    parents: list[int] | None = None


@dataclass
class Outcome:
    tokens: list[int]  # accepted, in order
    confidences: list[float]
    rejected: list[int]  # proposals or drafts not accepted
    rejected_confidences: list[float]
    n_verified: int = 0  # leading to_verify tokens that were accepted: their KV (computed as real inputs) is valid
    proposal_logits: torch.Tensor | None = None  # (n, V): the logits behind the record's candidates
    tree_depths: list[list[int]] | None = None  # tree drafts: the candidates checked at each depth
    tree_path: list[int] | None = None  # tree drafts: the accepted path's draft at each depth
    repeat_guard: bool = False  # mars: the repeat guard (DecodeConfig.repeat_tau) cut the chain shorter than tau did
