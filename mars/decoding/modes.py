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
           tau only filters which drafts are worth sending. Drafts may instead come from n-gram lookup in
           the prompt and the text so far (mars.decoding.lookup), or from whichever of the two sources the rule
           `prefer_lookup` expects to get more drafts accepted; the AR check keeps the text exact either way.
  jacobi   fixed-point iteration on guesses fed as real tokens (no masks): a peer that needs no training
"""

from __future__ import annotations

import torch

from mars.decoding.acceptance import (accept_length, calibrate_logits, choose_and_score, matched_prefix,
                                      repeat_flags_list, to_host)
from mars.decoding.lookup import Lookup, lookup_drafts
from mars.decoding.plan import Outcome, RowPlan
from mars.decoding.tree import TreeMode, default_tree_groups

DRAFT_SOURCES = ("mars", "lookup", "both")  # verified mode: where the drafts of a pass come from




class ARMode:
    name = "ar"
    scoring = None  # the backend's faster scoring (mars.runtime.scoring), set by make_mode; None: torch ops

    def plan(self, row, cfg, tau) -> RowPlan:
        return RowPlan()

    def accept(self, row, plan, main, groups, cfg, tau, gen) -> Outcome:
        tok, conf = to_host(*choose_and_score(main[:1], cfg.confidence, cfg.temperature, gen,
                                              scoring=self.scoring))
        return Outcome(tok, conf, [], [], proposal_logits=main[:1])


class MarsMode:
    name = "mars"
    scoring = None  # the backend's faster scoring (mars.runtime.scoring), set by make_mode; None: torch ops

    def __init__(self, temperatures=None):
        self.temperatures = temperatures  # per mask index: draft calibration (None: raw confidences)

    def plan(self, row, cfg, tau) -> RowPlan:
        return RowPlan(groups=[(0, cfg.block_size - 1)] if cfg.block_size > 1 else [])

    def accept(self, row, plan, main, groups, cfg, tau, gen) -> Outcome:
        logits = torch.cat([main[:1]] + groups[:1])  # (B, V): the AR token, then the masks in order
        tok, conf = choose_and_score(logits, cfg.confidence, cfg.temperature, gen,
                                     confidence_logits=calibrate_logits(logits, self.temperatures, ar_rows=1),
                                     scoring=self.scoring)
        # scored where the logits are (a GPU's); the ids and confidences come back in one copy and the count is
        # taken on the host (a few comparisons: cheaper than the kernel launches of the tensor rule)
        t, c = to_host(tok, conf)
        n = accept_length(c, tau, cfg.max_tokens_per_pass)
        guarded = n
        if cfg.repeat_tau is not None and n > 1:
            # the guard reads the row's text: on the host, from the values just fetched (no second device wait)
            guarded = accept_length(c, tau, cfg.max_tokens_per_pass, repeat_flags_list(row.tokens, t), cfg.repeat_tau)
        return Outcome(t[:guarded], c[:guarded], t[guarded:], c[guarded:], proposal_logits=logits,
                       repeat_guard=guarded < n)


class VerifiedMode:
    name = "verified"
    scoring = None  # the backend's faster scoring (mars.runtime.scoring), set by make_mode; None: torch ops

    def __init__(self, groups: str = "all", temperatures=None, drafts: str = "mars"):
        self.groups = groups  # "all": one mask group per acceptance outcome; "last": only after all drafts
        self.temperatures = temperatures  # per mask index: draft calibration (None: raw confidences)
        self.drafts = drafts  # "mars": last pass's mask drafts; "lookup": n-gram copies; "both": per pass

    def plan(self, row, cfg, tau) -> RowPlan:
        n = cfg.block_size - 1
        cap = cfg.max_tokens_per_pass - 1 if cfg.max_tokens_per_pass is not None else None
        drafts, conf, source = list(row.drafts), list(row.draft_conf), "mars"
        if self.drafts != "mars":
            look = lookup_drafts(row.tokens, max_drafts=cap)
            if self.drafts == "lookup" or prefer_lookup(look, conf):
                drafts, conf, source = look.drafts, None, "lookup"
        if not drafts:
            source = None
        # pure lookup needs no masks: it is prompt-lookup decoding on this core, and works without a mask token
        if n < 1 or self.drafts == "lookup":
            return RowPlan(to_verify=drafts, source=source, to_verify_conf=conf)
        k = len(drafts)
        js = range(k + 1) if self.groups == "all" else [k]
        return RowPlan(to_verify=drafts, groups=[(j, n) for j in js], source=source, to_verify_conf=conf)

    def accept(self, row, plan, main, groups, cfg, tau, gen) -> Outcome:
        drafts = plan.to_verify
        # greedy: the AR model's own choice after each input
        ar_tok, ar_conf = to_host(*choose_and_score(main, "prob", scoring=self.scoring))
        m = matched_prefix(drafts, ar_tok)
        if plan.to_verify_conf is not None:
            rejected_conf = plan.to_verify_conf[m:]
        else:  # copied drafts have no confidence of their own: report the verifying model's probability of each
            probs = torch.softmax(main[m:len(drafts)].float(), dim=-1)
            ix = torch.tensor(drafts[m:], dtype=torch.long, device=probs.device)
            rejected_conf = probs.gather(-1, ix[:, None])[:, 0].tolist()
        out = Outcome(drafts[:m] + [ar_tok[m]], ar_conf[: m + 1], drafts[m:], rejected_conf,
                      n_verified=m, proposal_logits=main)
        # next drafts: the group that saw exactly the accepted drafts proposes what follows the AR token
        row.drafts, row.draft_conf = [], []
        idx = [j for j, _ in plan.groups]
        if m in idx:
            g = groups[idx.index(m)]
            tok, conf = choose_and_score(g, cfg.confidence, confidence_logits=calibrate_logits(g, self.temperatures, 0),
                                         scoring=self.scoring)
            tok, conf = to_host(tok, conf)
            keep = accept_length([1.0] + conf, tau) - 1  # leading conf >= tau
            if cfg.max_tokens_per_pass is not None:
                keep = min(keep, cfg.max_tokens_per_pass - 1)
            row.drafts, row.draft_conf = tok[:keep], conf[:keep]
        return out


def prefer_lookup(look: Lookup, mars_conf: list[float]) -> bool:
    """The "both" rule: send the copied drafts when they are expected to get more tokens accepted.

    Mask drafts: expected accepted = sum over k of conf_1 * ... * conf_k, the chance that the first k all
    match (drafts are accepted left to right). Measured against the AR text (scripts/measure_drafts.py, since removed,
    1002 passes) this is calibrated: in bins of 0.25 the mean accepted count is within ~0.1 of it.
    Copied drafts: the measured mean accepted count at their match length (mars.decoding.lookup.EXPECTED_ACCEPTED).
    Ties go to the mask drafts, which are the narrower input. (The confidences are read as probabilities;
    with confidence "entropy" or "margin" the rule leans towards lookup.)
    Counterfactually on those passes (each pass scored with either source's drafts, 2n copies): this rule
    1.670 accepted tokens per pass, mask drafts only 1.654, lookup only 1.241, a perfect choice 1.779; a
    plain "lookup when the match is >= 2 tokens" 1.686, within the noise of 1002 passes. The expected-count
    rule is kept because it also uses the mask drafts' confidence, which the threshold rule ignores.
    """
    expected_mars, run = 0.0, 1.0
    for c in mars_conf:
        run *= c
        expected_mars += run
    return look.expected > expected_mars


class JacobiMode:
    name = "jacobi"
    scoring = None  # the backend's faster scoring (mars.runtime.scoring), set by make_mode; None: torch ops

    def plan(self, row, cfg, tau) -> RowPlan:
        n = cfg.block_size - 1
        guesses = list(row.drafts)[:n]
        guesses += [row.tokens[-1]] * (n - len(guesses))  # start from copies of the last token
        return RowPlan(to_verify=guesses)

    def accept(self, row, plan, main, groups, cfg, tau, gen) -> Outcome:
        pred, conf = to_host(*choose_and_score(main, "prob", scoring=self.scoring))
        g = plan.to_verify
        m = matched_prefix(g, pred)
        row.drafts = pred[m + 1:]  # the unverified predictions are the next guesses
        row.draft_conf = conf[m + 1:]
        return Outcome(pred[: m + 1], conf[: m + 1], g[m:], [], n_verified=m, proposal_logits=main)


MODES = {m.name: m for m in (MarsMode, ARMode, VerifiedMode, JacobiMode)}  # the registry: DecodeConfig, CLI
VERIFY_GROUPS = ("all", "last")


def make_mode(cfg, lm=None, scoring=None):
    """The mode object for cfg.mode; `lm`'s draft calibration (mars.json "calibration") applies to the
    confidence of every mask proposal in the mars and verified modes (the AR token is untouched).
    `scoring`: the backend's faster scoring (mars.runtime.scoring; None: torch ops)."""
    mode = _new_mode(cfg, lm)
    mode.scoring = scoring
    return mode


def _new_mode(cfg, lm):
    temps = ((getattr(lm, "calibration", None) or {}).get("temperatures")) or None
    if cfg.mode == "mars":
        return MarsMode(temps)
    if cfg.mode == "verified" and cfg.tree_nodes:
        groups = cfg.tree_groups
        if groups is None:
            model = getattr(lm, "model", None)
            groups = default_tree_groups(model.device.type if hasattr(model, "device") else "cpu")
        # the table is handed in on lm.datastore (mars.models.datastore reads the shipped one); None: masks and text
        store = getattr(lm, "datastore", None) if cfg.datastore else None
        vocab = getattr(getattr(getattr(lm, "model", None), "config", None), "vocab_size", None)
        return TreeMode(cfg.tree_nodes, cfg.verify_groups, temps, cfg.drafts, groups, store, vocab, cfg.pass_costs,
                        cfg.group_cost)
    if cfg.mode == "verified":
        return VerifiedMode(cfg.verify_groups, temps, cfg.drafts)
    return MODES[cfg.mode]()
