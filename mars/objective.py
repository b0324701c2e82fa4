"""The MARS training objective: the [clean | noisy] attention mask, the batch layout and the loss.

One forward pass sees two copies of each sequence side by side: the clean copy (positions 0..L-1) and a
noisy copy in which every response token is the mask token. The noisy copy may start at a block boundary
`s` instead of 0 (`noisy_start`): noisy copies of whole prompt blocks are identical to the clean copy and
carry no loss, so dropping them saves compute without changing any scored prediction.

Rules (METHOD.md), with block(t) = t // B counted from position 0 of the sequence:
  clean -> clean : k <= q                       (causal)
  noisy -> noisy : block(k) == block(q), k <= q (causal inside the block)
  noisy -> clean : block(k) <  block(q)         (strictly earlier clean blocks)
  clean -> noisy : never
Logits stay right-shifted: the output at position t is scored against token t+1 in both copies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mars.masks import additive_mask


def mars_attention_mask(length: int, block_size: int, noisy_start: int = 0) -> torch.Tensor:
    """Boolean (L + L - s, L + L - s) mask for one sequence laid out as [clean 0..L-1 | noisy s..L-1].

    True = the query (row) may attend to the key (column). `noisy_start` must be a block boundary.
    """
    if block_size < 1 or length < 1:
        raise ValueError("length and block_size must be >= 1")
    if noisy_start % block_size or not 0 <= noisy_start <= length:
        raise ValueError(f"noisy_start {noisy_start} must be a block boundary inside [0, {length}]")
    clean_pos = torch.arange(length)
    noisy_pos = torch.arange(noisy_start, length)
    cq, ck = clean_pos[:, None], clean_pos[None, :]
    nq, nk = noisy_pos[:, None], noisy_pos[None, :]
    clean_clean = ck <= cq
    noisy_noisy = (nk // block_size == nq // block_size) & (nk <= nq)
    noisy_clean = ck // block_size < nq // block_size
    clean_noisy = torch.zeros(length, len(noisy_pos), dtype=torch.bool)
    top = torch.cat([clean_clean, clean_noisy], dim=1)
    bottom = torch.cat([noisy_clean, noisy_noisy], dim=1)
    return torch.cat([top, bottom], dim=0)


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


def build_batch(
    examples: list[Example],
    block_size: int,
    mask_token_id: int,
    pad_token_id: int,
    max_length: int | None = None,
    drop_prompt_noisy: bool = True,
    skip_last_slot: bool = False,
) -> MarsBatch:
    """Lay out a batch of examples for one MARS forward pass.

    Each sequence is prompt + response, padded with EOS (pad_token_id) to a multiple of B when the
    response finished (those pads are scored, as in the paper: the model learns to stop inside a block).
    `skip_last_slot` drops the loss of the last noisy slot of each block, whose target (distance B+1)
    the sliding-window decoder never uses.
    """
    B = block_size
    rows = []
    for ex in examples:
        ids = list(ex.prompt_ids) + list(ex.response_ids)
        if max_length is not None:
            ids = ids[:max_length]
        p = len(ex.prompt_ids)
        if p >= len(ids):
            raise ValueError("an example has no response tokens left after truncation")
        scored_end = len(ids)  # positions < scored_end are real targets
        if ex.finished and len(ids) % B:
            ids += [pad_token_id] * (B - len(ids) % B)
            scored_end = len(ids)
        s = (p // B) * B if drop_prompt_noisy else 0
        rows.append((ids, p, s, scored_end))
    Lc = max(len(r[0]) for r in rows)
    Lc += (-Lc) % B
    Ln = max(Lc - s for _, _, s, _ in rows)
    b = len(rows)
    input_ids = torch.full((b, Lc + Ln), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((b, Lc + Ln), dtype=torch.long)
    allowed = torch.zeros((b, 1, Lc + Ln, Lc + Ln), dtype=torch.bool)
    clean_labels = torch.full((b, Lc), -100, dtype=torch.long)
    noisy_labels = torch.full((b, Ln), -100, dtype=torch.long)
    for i, (ids, p, s, end) in enumerate(rows):
        L = len(ids)
        seq = torch.tensor(ids)
        noisy = seq[s:].clone()
        noisy[max(p - s, 0):] = mask_token_id  # every response position becomes a mask
        n = L - s
        # ids: (b, Lc + Ln) = [clean 0..L-1, pad | noisy s..L-1, pad]
        input_ids[i, :L] = seq
        input_ids[i, Lc:Lc + n] = noisy
        position_ids[i, :L] = torch.arange(L)
        position_ids[i, Lc:Lc + n] = torch.arange(s, L)
        m = mars_attention_mask(L, B, s)
        allowed[i, 0, :L, :L] = m[:L, :L]
        allowed[i, 0, :L, Lc:Lc + n] = m[:L, L:]
        allowed[i, 0, Lc:Lc + n, :L] = m[L:, :L]
        allowed[i, 0, Lc:Lc + n, Lc:Lc + n] = m[L:, L:]
        # targets: output at t scores token t+1, for response tokens t+1 in [p, end)
        t = torch.arange(p - 1, end - 1)
        clean_labels[i, t] = seq[t + 1]
        tn = t[t >= s]
        keep = tn % B != B - 1 if skip_last_slot else torch.ones_like(tn, dtype=torch.bool)
        noisy_labels[i, tn[keep] - s] = seq[tn[keep] + 1]
    # padding queries attend to themselves only, so no attention row is empty (an empty row gives NaN)
    idx = torch.arange(Lc + Ln)
    allowed[:, 0, idx, idx] = True
    return MarsBatch(input_ids, position_ids, allowed, clean_labels, noisy_labels, Lc)


def mars_loss(logits: torch.Tensor, batch: MarsBatch) -> dict[str, torch.Tensor]:
    """CE(noisy) + CE(clean), equal weights, each a mean over its scored tokens.

    logits: (b, Lc + Ln, V). Returns the total and both terms (the clean term is the "SFT loss").
    """
    Lc = batch.clean_len
    V = logits.shape[-1]
    clean = F.cross_entropy(logits[:, :Lc].reshape(-1, V).float(), batch.clean_labels.reshape(-1), ignore_index=-100)
    noisy = F.cross_entropy(logits[:, Lc:].reshape(-1, V).float(), batch.noisy_labels.reshape(-1), ignore_index=-100)
    return {"loss": noisy + clean, "noisy": noisy, "clean": clean}


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
