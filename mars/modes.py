"""Decoding modes: what each row feeds to a forward pass, and what it accepts from the logits.

A mode has two verbs (compare transformers' candidate generators):
  plan(row, cfg, tau)                -> RowPlan: tokens fed as real after the row's uncached tokens
                                        (drafts, guesses) and groups of masks
  accept(row, plan, main, groups, ...) -> Outcome: accepted tokens and what else the pass learnt
`main` holds the logits of the last real token and of every extra token, in order (row i predicts the
token after input i); `groups[g]` the logits of group g's masks.

  ar       one token per pass, no masks: the baseline
  mars     B-1 masks after the real tokens; accept left to right while confidence >= tau (the paper)
  verified the previous pass's mask drafts are fed as real tokens and checked against the model's own AR
           logits: the longest verified prefix plus the AR token at the first mismatch is accepted, so the
           text is exactly AR greedy. Groups of masks propose the next drafts; group j sees the first j
           drafts, so whichever prefix is accepted, some group's proposals stay valid (the paper's Sec. 4.6).
           tau only filters which drafts are worth sending.
  jacobi   fixed-point iteration on guesses fed as real tokens (no masks): a peer that needs no training
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mars.acceptance import accept_lengths, calibrate_logits, choose_and_score


@dataclass
class RowPlan:
    extra: list[int] = field(default_factory=list)  # fed as real tokens right after the row's real tokens
    groups: list[tuple[int, int]] = field(default_factory=list)  # (j, n): n masks that see the first j extras


@dataclass
class Outcome:
    tokens: list[int]  # accepted, in order
    confidences: list[float]
    rejected: list[int]  # proposals or drafts not accepted
    rejected_confidences: list[float]
    verified_extra: int = 0  # leading extras that were accepted: their KV (computed as real inputs) is valid
    proposal_logits: torch.Tensor | None = None  # (n, V): the logits behind the record's candidates


class ARMode:
    name = "ar"

    def plan(self, row, cfg, tau) -> RowPlan:
        return RowPlan()

    def accept(self, row, plan, main, groups, cfg, tau, gen) -> Outcome:
        tok, conf = choose_and_score(main[:1], cfg.confidence, cfg.temperature, gen)
        return Outcome(tok.tolist(), conf.tolist(), [], [], proposal_logits=main[:1])


class MarsMode:
    name = "mars"

    def __init__(self, temperatures=None):
        self.temperatures = temperatures  # per mask index: draft calibration (None: raw confidences)

    def plan(self, row, cfg, tau) -> RowPlan:
        return RowPlan(groups=[(0, cfg.block_size - 1)] if cfg.block_size > 1 else [])

    def accept(self, row, plan, main, groups, cfg, tau, gen) -> Outcome:
        logits = torch.cat([main[:1]] + groups[:1])  # (B, V): the AR token, then the masks in order
        tok, conf = choose_and_score(logits, cfg.confidence, cfg.temperature, gen,
                                     confidence_logits=calibrate_logits(logits, self.temperatures, ar_rows=1))
        n = int(accept_lengths(conf[None], tau, cfg.max_tokens_per_pass)[0])
        t, c = tok.tolist(), conf.tolist()
        return Outcome(t[:n], c[:n], t[n:], c[n:], proposal_logits=logits)


class VerifiedMode:
    name = "verified"

    def __init__(self, groups: str = "all", temperatures=None):
        self.groups = groups  # "all": one mask group per acceptance outcome; "last": only after all drafts
        self.temperatures = temperatures  # per mask index: draft calibration (None: raw confidences)

    def plan(self, row, cfg, tau) -> RowPlan:
        k = len(row.drafts)
        n = cfg.block_size - 1
        if n < 1:
            return RowPlan()
        js = range(k + 1) if self.groups == "all" else [k]
        return RowPlan(extra=list(row.drafts), groups=[(j, n) for j in js])

    def accept(self, row, plan, main, groups, cfg, tau, gen) -> Outcome:
        drafts = plan.extra
        ar_tok, ar_conf = choose_and_score(main, "prob")  # greedy: the AR model's own choice after each input
        ar_tok, ar_conf = ar_tok.tolist(), ar_conf.tolist()
        m = 0
        while m < len(drafts) and drafts[m] == ar_tok[m]:
            m += 1
        out = Outcome(drafts[:m] + [ar_tok[m]], ar_conf[: m + 1], drafts[m:], row.draft_conf[m:],
                      verified_extra=m, proposal_logits=main)
        # next drafts: the group that saw exactly the accepted drafts proposes what follows the AR token
        row.drafts, row.draft_conf = [], []
        idx = [j for j, _ in plan.groups]
        if m in idx:
            g = groups[idx.index(m)]
            tok, conf = choose_and_score(g, cfg.confidence, confidence_logits=calibrate_logits(g, self.temperatures, 0))
            keep = int(accept_lengths(torch.cat([torch.ones(1), conf])[None], tau)[0]) - 1  # leading conf >= tau
            if cfg.max_tokens_per_pass is not None:
                keep = min(keep, cfg.max_tokens_per_pass - 1)
            row.drafts, row.draft_conf = tok.tolist()[:keep], conf.tolist()[:keep]
        return out


class JacobiMode:
    name = "jacobi"

    def plan(self, row, cfg, tau) -> RowPlan:
        n = cfg.block_size - 1
        guesses = list(row.drafts)[:n]
        guesses += [row.tokens[-1]] * (n - len(guesses))  # start from copies of the last token
        return RowPlan(extra=guesses)

    def accept(self, row, plan, main, groups, cfg, tau, gen) -> Outcome:
        pred, conf = choose_and_score(main, "prob")
        pred, conf = pred.tolist(), conf.tolist()
        g = plan.extra
        m = 0
        while m < len(g) and g[m] == pred[m]:
            m += 1
        row.drafts = pred[m + 1:]  # the unverified predictions are the next guesses
        row.draft_conf = conf[m + 1:]
        return Outcome(pred[: m + 1], conf[: m + 1], g[m:], [], verified_extra=m, proposal_logits=main)


MODES = {m.name: m for m in (MarsMode, ARMode, VerifiedMode, JacobiMode)}  # the registry: DecodeConfig, CLI
VERIFY_GROUPS = ("all", "last")


def make_mode(cfg, lm=None):
    """The mode object for cfg.mode; `lm`'s draft calibration (mars.json "calibration") applies to the
    confidence of every mask proposal in the mars and verified modes (the AR token is untouched)."""
    temps = ((getattr(lm, "calibration", None) or {}).get("temperatures")) or None
    if cfg.mode == "mars":
        return MarsMode(temps)
    if cfg.mode == "verified":
        return VerifiedMode(cfg.verify_groups, temps)
    return MODES[cfg.mode]()
