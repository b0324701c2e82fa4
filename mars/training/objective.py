"""The MARS training objective: the [clean | noisy] attention mask, the batch layout and the loss.

One forward pass sees two copies of each sequence side by side: the clean copy (positions 0..L-1) and a
noisy copy in which every response token is the mask token. The noisy copy may start at a block boundary
`s` instead of 0 (`noisy_start`): noisy copies of whole prompt blocks are identical to the clean copy, so
the noisy copy starts at the block holding the last prompt token (its output predicts the first response
token) and dropping the earlier blocks saves compute without losing any scored prediction.
Options: a shifted block grid (blocks start at offset + k*B) and several noisy copies with different
offsets against one clean copy ([clean | noisy_1 | noisy_2 ...], `multi_copy_mask`).

The attention masks themselves live with every other mask in mars.decoding.masks (the four rules of docs/method.md).
Logits stay right-shifted: the output at position t is scored against token t+1 in both copies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mars.decoding.masks import multi_copy_mask
from mars.runtime.attention import additive_mask


@dataclass
class Example:
    """One tokenized training example."""

    prompt_ids: list[int]
    response_ids: list[int]  # includes the EOS when the response finished
    finished: bool = True  # unfinished responses get no EOS padding in the loss


@dataclass
class MarsBatch:
    input_ids: torch.Tensor  # (b, Lc + Ln) = [clean | noisy]
    position_ids: torch.Tensor  # (b, Lc + Ln)
    attention_mask: torch.Tensor  # (b, 1, Lc + Ln, Lc + Ln) bool
    clean_labels: torch.Tensor  # (b, Lc): token t+1 for scored clean positions t, -100 elsewhere
    noisy_labels: torch.Tensor  # (b, Ln): the same for noisy positions
    clean_len: int  # Lc

    def _map(self, fn) -> "MarsBatch":
        return MarsBatch(*(fn(getattr(self, f)) for f in _TENSOR_FIELDS), clean_len=self.clean_len)

    def to(self, device, non_blocking: bool = False) -> "MarsBatch":
        """Every tensor on `device` (accelerate's dataloader calls this: without it the batch stays on the CPU)."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "MarsBatch":
        """Page-locked copies (DataLoader pin_memory=True calls this), so the copy to a GPU can overlap compute."""
        return self._map(lambda t: t.pin_memory())


_TENSOR_FIELDS = ("input_ids", "position_ids", "attention_mask", "clean_labels", "noisy_labels")


@dataclass
class Collate:
    """The DataLoader's collate_fn: examples -> MarsBatch. A plain picklable object, so DataLoader worker
    processes can build the batch layout (Python loops over rows and masks) while the device trains.

    With `grids` the items are (index, example) and each draw's block-grid offsets are a function of
    (seed, epoch, index): set `epoch` before each epoch's iterator is made (workers copy this object then).
    """

    block_size: int
    mask_token_id: int
    pad_token_id: int
    max_length: int | None = None
    drop_prompt_noisy: bool = True
    skip_last_slot: bool = False
    grids: bool = False  # items carry their index; offsets drawn per draw
    seed: int = 0
    noisy_copies: int = 1
    shift_blocks: bool = False
    epoch: int = 0

    def __call__(self, items: list) -> MarsBatch:
        offsets = None
        if self.grids:
            offsets = [draw_offsets(self.seed, self.epoch, i, self.block_size, self.noisy_copies, self.shift_blocks)
                       for i, _ in items]
            items = [ex for _, ex in items]
        return build_batch(items, self.block_size, self.mask_token_id, self.pad_token_id, self.max_length,
                           self.drop_prompt_noisy, self.skip_last_slot, offsets=offsets)


def noisy_start(prompt_len: int, block_size: int, offset: int = 0) -> int:
    """First noisy position kept when prompt blocks are dropped: the boundary (on the grid shifted by
    `offset`) of the block holding position p - 1, whose output predicts the first response token."""
    last = max(prompt_len - 1, 0)
    if last < offset:
        return 0
    return offset + (last - offset) // block_size * block_size


def draw_offsets(seed: int, epoch: int, index: int, block_size: int, copies: int = 1, shift: bool = True) -> list[int]:
    """Block-grid offsets for one draw of one example: `copies` distinct offsets in [0, B).

    shift=True: all at random; shift=False: the first copy keeps the grid at 0, the others are random.
    A function of (seed, epoch, example index): a resumed run draws what the straight run drew.
    """
    import random

    if not 1 <= copies <= block_size:
        raise ValueError(f"noisy copies must be in [1, B={block_size}], got {copies}")
    rng = random.Random(f"mars-offsets:{seed}:{epoch}:{index}")
    if shift:
        return rng.sample(range(block_size), copies)
    return [0] + rng.sample(range(1, block_size), copies - 1)


def build_batch(
    examples: list[Example],
    block_size: int,
    mask_token_id: int,
    pad_token_id: int,
    max_length: int | None = None,
    drop_prompt_noisy: bool = True,
    skip_last_slot: bool = False,
    offsets: list[list[int]] | None = None,
) -> MarsBatch:
    """Lay out a batch of examples for one MARS forward pass.

    Each sequence is prompt + response, padded with EOS (pad_token_id) to a multiple of B when the
    response finished (those pads are scored, as in the paper: the model learns to stop inside a block).
    A response cut by `max_length` counts as unfinished: no EOS target after the cut (the authors pad it with EOS
    labels; docs/method.md lists this and the other departures).
    `drop_prompt_noisy` starts the noisy copy at the block holding the last prompt token (earlier noisy
    prompt blocks equal the clean copy and carry no target); no response target is lost.
    `skip_last_slot` drops the loss of the last noisy slot of each block, whose target (distance B+1)
    the sliding-window decoder never uses.
    `offsets` (one list per example, one offset in [0, B) per noisy copy; None = one copy on the grid
    starting at 0) shifts each noisy copy's block grid: blocks start at offset + k*B. Several offsets put
    several noisy copies after the one clean copy: [clean | noisy_1 | noisy_2 ...]. A finished response
    is padded until every copy's last block is complete.
    """
    B = block_size
    rows = []
    for i, ex in enumerate(examples):
        offs = [0] if offsets is None else [int(o) for o in offsets[i]]
        if not offs or any(not 0 <= o < B for o in offs):
            raise ValueError(f"offsets must be non-empty and in [0, {B}), got {offs}")
        ids = list(ex.prompt_ids) + list(ex.response_ids)
        finished = ex.finished
        if max_length is not None and len(ids) > max_length:
            ids = ids[:max_length]
            finished = False  # the cut response did not end here: no EOS to learn after it
        p = len(ex.prompt_ids)
        if p >= len(ids):
            raise ValueError("an example has no response tokens left after truncation")
        real = len(ids)
        # scored end of each copy: its grid's next block end when finished (EOS pads scored), else the last token
        ends = [real + ((o - real) % B if finished else 0) for o in offs]
        ids += [pad_token_id] * (max(ends) - real)
        starts = [noisy_start(p, B, o) if drop_prompt_noisy else 0 for o in offs]
        if drop_prompt_noisy and skip_last_slot:  # p - 1 is its block's last slot: that target is skipped anyway
            starts = [p if (p - 1 - o) % B == B - 1 else st for st, o in zip(starts, offs)]
        rows.append((ids, p, list(zip(starts, ends, offs))))
    Lc = max(len(r[0]) for r in rows)
    Lc += (-Lc) % B
    # noisy width: every row's copies, plus the clean copy's batch padding (as wide as the one-copy layout)
    Ln = max(Lc - len(ids) + sum(e - s for s, e, _ in copies) for ids, _, copies in rows)
    b = len(rows)
    input_ids = torch.full((b, Lc + Ln), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((b, Lc + Ln), dtype=torch.long)
    allowed = torch.zeros((b, 1, Lc + Ln, Lc + Ln), dtype=torch.bool)
    clean_labels = torch.full((b, Lc), -100, dtype=torch.long)
    noisy_labels = torch.full((b, Ln), -100, dtype=torch.long)
    for i, (ids, p, copies) in enumerate(rows):
        L = len(ids)
        seq = torch.tensor(ids)
        # ids: (b, Lc + Ln) = [clean 0..L-1, pad | noisy_1 s1..e1-1, noisy_2 ..., pad]
        input_ids[i, :L] = seq
        position_ids[i, :L] = torch.arange(L)
        n_all = sum(e - s for s, e, _ in copies)
        where = torch.cat([torch.arange(L), Lc + torch.arange(n_all)])
        allowed[i, 0, where[:, None], where[None, :]] = multi_copy_mask(L, B, copies)
        # targets: output at t scores token t+1, for response tokens t+1 in [p, end)
        t = torch.arange(p - 1, copies[0][1] - 1)
        clean_labels[i, t] = seq[t + 1]
        at = Lc
        for s, e, o in copies:
            noisy = seq[s:e].clone()
            noisy[max(p - s, 0):] = mask_token_id  # every response position becomes a mask
            input_ids[i, at:at + e - s] = noisy
            position_ids[i, at:at + e - s] = torch.arange(s, e)
            tn = torch.arange(max(p - 1, s), e - 1)
            if skip_last_slot:
                tn = tn[(tn - o) % B != B - 1]
            noisy_labels[i, at - Lc + tn - s] = seq[tn + 1]
            at += e - s
    # padding queries attend to themselves only, so no attention row is empty (an empty row gives NaN)
    idx = torch.arange(Lc + Ln)
    allowed[:, 0, idx, idx] = True
    return MarsBatch(input_ids, position_ids, allowed, clean_labels, noisy_labels, Lc)


def mars_loss(logits: torch.Tensor, batch: MarsBatch, per_sequence: bool = False) -> dict[str, torch.Tensor]:
    """CE(noisy) + CE(clean), equal weights.

    Default: each term is a mean over its scored tokens (long responses weigh more). `per_sequence`: the
    authors' weighting, each term averaged per sequence (all noisy copies of a sequence together), then
    over the sequences that have scored tokens.
    logits: (b, Lc + Ln, V). Returns the total and both terms (the clean term is the "SFT loss").
    """
    Lc = batch.clean_len
    ce = _ce_per_sequence if per_sequence else _ce_per_token
    clean = ce(logits[:, :Lc], batch.clean_labels)
    noisy = ce(logits[:, Lc:], batch.noisy_labels)
    return {"loss": noisy + clean, "noisy": noisy, "clean": clean}


def noisy_loss(noisy_logits: torch.Tensor, batch: MarsBatch, per_sequence: bool = False) -> dict[str, torch.Tensor]:
    """The gated adapter's loss: CE(noisy) alone. Its clean copy is the bare model, so the clean term is a
    constant with no gradient. noisy_logits: (b, Ln, V), as `gated_forward` returns them."""
    noisy = (_ce_per_sequence if per_sequence else _ce_per_token)(noisy_logits, batch.noisy_labels)
    return {"loss": noisy, "noisy": noisy}


def _ce_per_token(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V).float(), labels.reshape(-1), ignore_index=-100)


def _ce_per_sequence(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    V = logits.shape[-1]
    tok = F.cross_entropy(logits.reshape(-1, V).float(), labels.reshape(-1), ignore_index=-100, reduction="none")
    tok = tok.view(labels.shape)
    n = (labels != -100).sum(-1)
    per_row = tok.sum(-1) / n.clamp(min=1)  # ignored positions contribute 0
    has = n > 0
    return per_row[has].mean() if bool(has.any()) else tok.sum() * 0.0


def distill_loss(student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) per scored position, averaged: keeps the clean copy's next-token
    distribution, not only its argmax, where the bare model had it (less drift of tau = 1.0 output).

    student, teacher: (b, L, V) logits of the clean copy; labels: (b, L), -100 where unscored.
    """
    keep = labels != -100
    s = F.log_softmax(student[keep].float(), -1)
    t = F.log_softmax(teacher[keep].float(), -1)
    if s.numel() == 0:
        return student.sum() * 0.0
    return F.kl_div(s, t, log_target=True, reduction="batchmean")


def clean_forward(model, batch: MarsBatch) -> torch.Tensor:
    """Logits of the clean copy alone (b, Lc, V): causal over the clean positions, exactly as in the
    two-copy pass (the clean copy never sees the noisy one)."""
    Lc = batch.clean_len
    return _logits(model, batch.input_ids[:, :Lc], batch.position_ids[:, :Lc], batch.attention_mask[:, :, :Lc, :Lc])


def forward_batch(model, batch: MarsBatch) -> torch.Tensor:
    """Run the model on a MarsBatch with its 4D mask; returns logits (b, Lc + Ln, V)."""
    return _logits(model, batch.input_ids, batch.position_ids, batch.attention_mask)


def gated_forward(model, batch: MarsBatch, adapter_off) -> torch.Tensor:
    """Noisy-copy logits (b, Ln, V) for a gated adapter (mars.models.gated), in two forwards.

    The clean copy is the bare model and never sees the noisy one, so it runs once without gradient (inside
    `adapter_off`, e.g. peft's `disable_adapter()`) and hands its keys and values to the noisy copy's
    forward, the only one differentiated: the backward pass skips the clean half of the sequence. Same
    logits as the one-forward layout (tested)."""
    Lc = batch.clean_len
    p = next(model.parameters())
    ids, pos, allowed = batch.input_ids.to(p.device), batch.position_ids.to(p.device), batch.attention_mask
    with torch.no_grad(), adapter_off:
        past = model(input_ids=ids[:, :Lc], position_ids=pos[:, :Lc],
                     attention_mask=additive_mask(allowed[:, :, :Lc, :Lc], p.dtype).to(p.device),
                     use_cache=True, logits_to_keep=1).past_key_values
    out = model(input_ids=ids[:, Lc:], position_ids=pos[:, Lc:],
                attention_mask=additive_mask(allowed[:, :, Lc:, :], p.dtype).to(p.device),
                past_key_values=past, use_cache=True)
    return out.logits


def _logits(model, input_ids: torch.Tensor, position_ids: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    dtype = next(model.parameters()).dtype
    device = next(model.parameters()).device
    out = model(
        input_ids=input_ids.to(device),
        position_ids=position_ids.to(device),
        attention_mask=additive_mask(allowed, dtype).to(device),
        use_cache=False,
    )
    return out.logits
