"""Confidence measures and the MARS acceptance rule, as small pure tensor functions.

Where the rule departs from the authors' code (tau compared in float32, tau 1.0 accepting no draft, a NaN
confidence rejected, entropy as exp(-H), the repeat guard), and why: docs/method.md."""

from __future__ import annotations

import math
import struct

import torch

CONFIDENCE_MEASURES = ("prob", "entropy", "margin")


def calibrate_logits(logits: torch.Tensor, temperatures, ar_rows: int = 1) -> torch.Tensor:
    """Draft calibration: divide mask proposals' logits by their mask index's temperature.

    logits: (n, V) proposals of one pass; the first `ar_rows` rows are AR tokens (left untouched), the
    following rows are masks 1, 2, ... in order; mask j is divided by temperatures[j - 1] (1.0 past the
    list). No temperatures: the same tensor back. Fitted per mask distance on held-out teacher-forced
    drafts (`python -m mars calibrate`), recorded in the adapter's mars.json.
    """
    if not temperatures:
        return logits
    n = logits.shape[0]
    masks = max(0, n - ar_rows)
    temps = [1.0] * min(ar_rows, n) + [float(temperatures[j]) if j < len(temperatures) else 1.0 for j in range(masks)]
    return logits.float() / torch.tensor(temps, dtype=torch.float32, device=logits.device)[:, None]


def choose_and_score(
    logits: torch.Tensor, measure: str = "prob", temperature: float = 0.0, generator: torch.Generator | None = None,
    confidence_logits: torch.Tensor | None = None, scoring=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick a token per position and score how confident the model is in it.

    logits: (..., V) -> (tokens (...), confidence (...)), confidence in [0, 1]:
      prob    : p(token)                      (the paper's default)
      entropy : exp(-H(p)), 1 / perplexity of the distribution: 1.0 for a one-hot, ~p for a peaked one
      margin  : p(top1) - p(top2)
    Greedy when temperature == 0, otherwise a seeded sample from softmax(logits / temperature); the
    confidence is always measured on the untempered distribution, so tau means the same in both.
    `confidence_logits` (e.g. `calibrate_logits(logits, ...)`): measure the confidence on these instead;
    the token is still chosen from `logits`.
    `scoring`: the backend's faster way to the common case (greedy, p(token)), e.g. one C call over CPU
    float32 logits (mars.runtime.scoring): `scoring.argmax_conf(logits)` -> (tokens, conf), or None where it
    does not apply; the same numbers as below up to float rounding.
    """
    if measure not in CONFIDENCE_MEASURES:
        raise ValueError(f"confidence measure must be one of {CONFIDENCE_MEASURES}, got {measure!r}")
    if (scoring is not None and temperature <= 0 and measure == "prob"
            and (confidence_logits is None or confidence_logits is logits)):
        fast = scoring.argmax_conf(logits)
        if fast is not None:
            return fast
    logp = torch.log_softmax((logits if confidence_logits is None else confidence_logits).float(), dim=-1)
    probs = logp.exp()
    if temperature > 0:
        flat = torch.softmax(logits.float().reshape(-1, logits.shape[-1]) / temperature, dim=-1)
        if generator is not None and flat.device != generator.device:
            flat = flat.to(generator.device)  # the seeded draw stays where the seed is: same text on every device
        tokens = torch.multinomial(flat, 1, generator=generator).reshape(logits.shape[:-1]).to(logits.device)
    else:
        tokens = logits.argmax(dim=-1)
    if measure == "prob":
        conf = probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    elif measure == "entropy":
        entropy = -(probs * logp).nan_to_num().sum(-1)
        conf = torch.exp(-entropy)
    else:
        top2 = probs.topk(2, dim=-1).values
        conf = top2[..., 0] - top2[..., 1]
    return tokens, conf


def top_probs(logits: torch.Tensor, k: int, scoring=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(probabilities, tokens) of the k likeliest tokens per row, descending: softmax then topk, or the
    backend's `scoring.top_probs(logits, k)` where it applies (one C call on a CPU). The inspector's
    candidates, the tree's children."""
    fast = scoring.top_probs(logits, k) if scoring is not None else None
    if fast is not None:
        return fast
    top = torch.softmax(logits.float(), dim=-1).topk(k, dim=-1)
    return top.values, top.indices


def accept_lengths(conf: torch.Tensor, tau: float, max_per_pass: int | None = None,
                   repeats: torch.Tensor | None = None, repeat_tau: float | None = None) -> torch.Tensor:
    """How many proposals each row accepts.

    conf: (b, n) confidences of the n proposals of a pass, left to right; column 0 is the ordinary AR
    token. Rule: accept column 0 always, then columns 1, 2, ... while every confidence so far is >= tau.
    tau >= 1 accepts column 0 only: that is exactly AR decoding, even where a float probability rounds to
    1.0 (a saturated probability is not a guarantee that the draft equals the AR token).
    Repeat guard (`repeats`: (b, n) bool from `repeat_flags`, `repeat_tau` not None): a draft that repeats
    what stands just before it must also clear repeat_tau; repeat_tau >= 1 never accepts one. Mask
    positions see only masks, so two neighbours can draft the same token ("Europe Europe"): the guard
    makes such a draft wait for the next pass, where it is the AR token or is not proposed at all.
    Returns (b,) long in [1, n] (or [1, max_per_pass]).
    """
    n = conf.shape[-1]
    if tau >= 1.0 or n == 1:
        lengths = torch.ones(conf.shape[:-1], dtype=torch.long, device=conf.device)
    else:
        ok = conf[..., 1:] >= tau
        if repeats is not None and repeat_tau is not None:
            clears = conf[..., 1:] >= repeat_tau if repeat_tau < 1.0 else torch.zeros_like(ok)
            ok = ok & (~repeats[..., 1:].bool() | clears)
        run = torch.cumprod(ok.long(), dim=-1)  # 1 while the chain is unbroken
        lengths = 1 + run.sum(-1)
    if max_per_pass is not None:
        lengths = lengths.clamp(max=max(1, int(max_per_pass)))
    return lengths


def matched_prefix(drafts, truth) -> int:
    """How many leading drafts equal the tokens the model itself chose (the lossless rule: the verified
    prefix); also how many leading tokens two texts share."""
    n = 0
    for x, y in zip(drafts, truth):
        if x != y:
            break
        n += 1
    return n


def accept_length(conf: list[float], tau: float, max_per_pass: int | None = None,
                  repeats: list[bool] | None = None, repeat_tau: float | None = None) -> int:
    """`accept_lengths` for one row whose confidences are already on the host: the same rule, in Python.

    conf: float32 confidences as Python floats (as `to_host` brings them back). The tensor rule compares a
    float32 tensor with tau, which PyTorch rounds to float32 first (0.9f >= 0.9 is True there), so the
    thresholds are rounded the same way here. Why: on a GPU each small tensor op is a kernel launch, and the
    count is a few comparisons of values the mode fetches anyway.
    """
    n = len(conf)
    length = 1
    if tau < 1.0 and n > 1:
        t = _float32(tau)
        guard = repeats is not None and repeat_tau is not None
        rt = _float32(repeat_tau) if guard and repeat_tau < 1.0 else None  # None: a repeat never clears
        for j in range(1, n):
            ok = conf[j] >= t
            if ok and guard and repeats[j]:
                ok = rt is not None and conf[j] >= rt
            if not ok:
                break
            length += 1
    if max_per_pass is not None:
        length = min(length, max(1, int(max_per_pass)))
    return length


def _float32(x: float) -> float:
    """x rounded to the nearest float32 (as PyTorch rounds a Python scalar compared with a float32 tensor)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def to_host(*tensors: torch.Tensor) -> list:
    """Small 0-d or 1-d results (ids, confidences, lengths) as Python values, brought back from the device in
    ONE copy: on a GPU each `.tolist()` waits for the device, so a mode fetches what a pass needs at once.
    Integer tensors come back as ints, float ones as the same floats (float32 -> float64 is exact)."""
    if any(t.dim() > 1 for t in tensors):
        raise ValueError("to_host takes 0-d or 1-d tensors")
    if all(t.device.type == "cpu" for t in tensors):
        return [t.tolist() for t in tensors]
    return _in_one_copy(tensors)


def _in_one_copy(tensors) -> list:
    flat = torch.cat([t.reshape(-1).double() for t in tensors]).tolist()  # ids < 2^53 stay exact
    out, at = [], 0
    for t in tensors:
        part = flat[at:at + t.numel()]
        at += t.numel()
        if not t.is_floating_point():
            part = [int(x) for x in part]
        out.append(part if t.dim() == 1 else part[0])
    return out


def repeat_flags(context: list[int], proposals: torch.Tensor, max_ngram: int = 2) -> torch.Tensor:
    """Which proposals of a pass repeat what stands right before them.

    context: the row's tokens so far (prompt and committed text; only the last 2 * max_ngram - 1 matter);
    proposals: (n,) the pass's tokens, AR token first. Proposal j is a repeat when, in context + proposals,
    the k tokens ending at it equal the k tokens just before those, for some k in 1..max_ngram: k = 1 is
    "Europe Europe", k = 2 catches "South America South America" at its last token. Drafts count against
    the drafts before them in the same pass, as they would be read if accepted. Returns (n,) bool.
    """
    return torch.tensor(repeat_flags_list(context, proposals.tolist(), max_ngram), dtype=torch.bool)


def repeat_flags_list(context: list[int], proposals: list[int], max_ngram: int = 2) -> list[bool]:
    """`repeat_flags` on host lists, as a list (for `accept_length`)."""
    tail = list(context[-(2 * max_ngram - 1):]) if max_ngram > 0 else []
    seq = tail + list(proposals)
    flags = []
    for j in range(len(tail), len(seq)):
        flags.append(any(j + 1 >= 2 * k and seq[j - k + 1:j + 1] == seq[j - 2 * k + 1:j - k + 1]
                         for k in range(1, max_ngram + 1)))
    return flags


def is_finite_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
