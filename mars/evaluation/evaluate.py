"""`python -m mars eval`: how good a MARS checkpoint is, on held-out self-distilled data.

Two kinds of measurement:
- teacher-forced draft accuracy (one forward per example, no generation): for each mask slot, how often
  its argmax is the AR token at that distance, and how confident it was (a calibration table). Cheap
  enough to track during training.
- real decoding at several tau: tokens per forward, the histogram of tokens per pass, exact and prefix
  agreement with the same model's tau=1.0 output, the mean per-token NLL of the text under the same model
  (AR) and under the bare model, and accuracy on known-answer questions.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from mars.training.objective import Example, build_batch, forward_batch


@dataclass
class DraftAccuracy:
    block_size: int
    accuracy_by_distance: dict[int, float]  # distance 2.. (mask slot o predicts distance o+2)
    count_by_distance: dict[int, int]
    est_tokens_per_pass: float  # if every draft matching AR were accepted, block-aligned windows
    calibration: list[dict]  # per confidence bin: mean confidence, accuracy, count
    confident: dict | None = None  # drafts at or above `threshold`: count, right, share of all, precision


def draft_accuracy(lm, examples: list[Example], block_size: int, bins: int = 10, threshold: float = 0.9,
                   temperatures: list[float] | None = None) -> DraftAccuracy:
    """Teacher-forced: noisy blocks over each example's response; targets are the response tokens.

    `temperatures`: per mask index (1..B-1) temperatures applied to the drafts' logits before their
    confidence is measured (the calibration `mars.decoding.acceptance.calibrate_logits` applies at decoding).
    """
    B = block_size
    hits: Counter = Counter()
    counts: Counter = Counter()
    chains: list[int] = []
    conf_correct: list[tuple[float, bool]] = []
    eos = lm.eos_token_ids[0]
    for ex in examples:
        batch = build_batch([ex], B, lm.mask_token_id, eos, drop_prompt_noisy=True)
        with torch.inference_mode():
            logits = forward_batch(lm.model, batch)[0].float().cpu()  # (Lc + Ln, V): counted on the CPU
        Lc = batch.clean_len
        labels = batch.noisy_labels[0]
        start = batch.position_ids[0, Lc].item()  # position of the first noisy slot (a block boundary)
        noisy = logits[Lc:]
        if temperatures:
            temps = torch.tensor([1.0] + list(temperatures) + [1.0] * B, dtype=noisy.dtype)
            slot = (torch.arange(len(noisy)) + start) % B  # mask index o + 1 at in-block offset o
            noisy = noisy / temps[slot + 1][:, None]
        probs = torch.softmax(noisy, -1)  # noisy part
        conf, pred = probs.max(-1)
        p = len(ex.prompt_ids)
        n = len(labels)
        for blk in range(0, n, B):
            if start + blk < p:
                continue  # the block holding the end of the prompt has real tokens, not a window of masks
            chain, alive = 1, True
            for o in range(B - 1):  # the last slot (distance B+1) is never used by the decoder
                i = blk + o
                if i >= n or labels[i] < 0:
                    break
                ok = bool(pred[i] == labels[i])
                counts[o + 2] += 1
                hits[o + 2] += ok
                conf_correct.append((float(conf[i]), ok))
                alive = alive and ok
                chain += alive
            chains.append(chain)
    edges = torch.linspace(0, 1, bins + 1).tolist()
    calib = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = [(c, k) for c, k in conf_correct if lo <= c < hi or (hi == 1.0 and c == 1.0)]
        if sel:
            calib.append({"bin": [round(lo, 2), round(hi, 2)], "confidence": sum(c for c, _ in sel) / len(sel),
                          "accuracy": sum(k for _, k in sel) / len(sel), "count": len(sel)})
    sure = [k for c, k in conf_correct if c >= threshold]
    confident = {"threshold": threshold, "count": len(sure), "right": sum(sure),
                 "share": len(sure) / max(1, len(conf_correct)), "precision": sum(sure) / len(sure) if sure else None}
    return DraftAccuracy(
        confident=confident,
        block_size=B,
        accuracy_by_distance={d: hits[d] / counts[d] for d in sorted(counts)},
        count_by_distance=dict(sorted(counts.items())),
        est_tokens_per_pass=sum(chains) / max(1, len(chains)),
        calibration=calib,
    )


def default_temperature_grid() -> list[float]:
    """241 temperatures from 0.1 to 10, 2% apart (log-spaced)."""
    import math

    return [math.exp(math.log(0.1) + i * (math.log(10.0) - math.log(0.1)) / 240) for i in range(241)]


def fit_temperatures(lm, examples: list[Example], block_size: int, grid: list[float] | None = None) -> dict:
    """Draft calibration: per mask index j = 1..B-1 (distance j + 1), the temperature T_j minimising the
    mean NLL of the response token (the AR/teacher token of self-distilled data) under softmax(logits / T_j),
    over the same teacher-forced drafts `draft_accuracy` counts. Searched on `grid` (2% steps by default);
    the argmax, hence every draft token, is unchanged by any T.

    Returns {"temperatures": [...], "nll_before": [...] (T = 1), "nll_after": [...], "drafts": [...]}.
    """
    B = block_size
    grid_t = torch.tensor(grid or default_temperature_grid(), dtype=torch.float64)
    nll = torch.zeros(B - 1, len(grid_t), dtype=torch.float64)
    nll_one = torch.zeros(B - 1, dtype=torch.float64)
    counts = [0] * (B - 1)
    eos = lm.eos_token_ids[0]
    for ex in examples:
        batch = build_batch([ex], B, lm.mask_token_id, eos, drop_prompt_noisy=True)
        with torch.inference_mode():
            logits = forward_batch(lm.model, batch)[0].cpu()  # the grid search runs in float64 on the CPU
        Lc = batch.clean_len
        labels = batch.noisy_labels[0]
        start = batch.position_ids[0, Lc].item()
        p = len(ex.prompt_ids)
        by_slot: list[list[int]] = [[] for _ in range(B - 1)]
        for blk in range(0, len(labels), B):
            if start + blk < p:
                continue  # as in draft_accuracy: the block holding the end of the prompt is no mask window
            for o in range(B - 1):
                i = blk + o
                if i >= len(labels) or labels[i] < 0:
                    break
                by_slot[o].append(i)
        for o, idx in enumerate(by_slot):
            if not idx:
                continue
            z = logits[Lc + torch.tensor(idx)].double()  # (n, V)
            zy = z.gather(-1, labels[idx][:, None]).squeeze(-1)
            counts[o] += len(idx)
            nll_one[o] += (torch.logsumexp(z, -1) - zy).sum()
            for g, T in enumerate(grid_t.tolist()):
                nll[o, g] += (torch.logsumexp(z / T, -1) - zy / T).sum()
    temps, after = [], []
    for o in range(B - 1):
        if not counts[o]:
            temps.append(1.0)
            after.append(None)
            continue
        g = int(nll[o].argmin())
        temps.append(round(float(grid_t[g]), 4))
        after.append(float(nll[o, g]) / counts[o])
    return {"temperatures": temps, "drafts": counts,
            "nll_before": [float(nll_one[o]) / counts[o] if counts[o] else None for o in range(B - 1)],
            "nll_after": after}


def known_answer_accuracy(results, answers: list[str]) -> float:
    """Fraction of outputs containing their expected answer (case-insensitive substring)."""
    ok = [a.lower() in r.text.lower() for r, a in zip(results, answers)]
    return sum(ok) / max(1, len(ok))


def decoding_eval(lm, bare, prompts: list[list[int]], taus, block_size: int, max_new: int, batch_size: int = 8,
                  known: tuple[list[list[int]], list[str]] | None = None, repeat_tau: float | None = "default") -> list[dict]:
    """Generate at each tau (batched: token-for-token the same as one by one) and score the runs.

    `repeat_tau`: the repeat guard (DecodeConfig.repeat_tau) for every tau ("default": the config's default). Each row's `stutter` counts the
    words its text repeats back to back that the tau 1.0 text of the same prompt does not (quality.stutter_rate);
    `repeat_guard_stops`: passes whose chain the guard cut.

    With a separate `bare` model, also the drift control: each tau's agreement with the bare model's own
    greedy text (at tau 1.0 that is how far the adapter moved the model's AR behaviour).
    """
    from mars.decoding.decoder import DecodeConfig, generate_ids
    from mars.evaluation.quality import mean_nll, prefix_match, stutter_rate
    from mars.decoding.records import RunTotals

    if repeat_tau == "default":
        repeat_tau = DecodeConfig.repeat_tau

    def generate(model, ids, cfg):
        out = []
        for i in range(0, len(ids), batch_size):
            out += generate_ids(model, ids[i:i + batch_size], cfg)
        return out

    def run(ids, tau):
        return generate(lm, ids, DecodeConfig(mode="mars", tau=tau, block_size=block_size, max_new_tokens=max_new,
                                              repeat_tau=repeat_tau))

    ref = None
    rows = []
    # drift control: the bare model's own greedy text, against which every tau's text is also compared
    bare_ref = None
    if bare is not None and bare is not lm:
        bare_ref = generate(bare, prompts, DecodeConfig(mode="ar", max_new_tokens=max_new))
    for tau in sorted(set(taus) | {1.0}, reverse=True):
        res = run(prompts, tau)
        if tau == 1.0:
            ref = res
        t = RunTotals.of(res)  # tokens, passes and the histogram only: batch_passes would mix the batches
        nll_self = [mean_nll(lm, p, r.token_ids) for p, r in zip(prompts, res) if r.token_ids]
        nll_bare = [mean_nll(bare, p, r.token_ids) for p, r in zip(prompts, res) if r.token_ids] if bare else []
        texts = [lm.tokenizer.decode(r.token_ids, skip_special_tokens=True) for r in res]
        refs = [lm.tokenizer.decode(r.token_ids, skip_special_tokens=True) for r in ref]
        row = {
            "tau": tau,
            "repeat_tau": repeat_tau,
            "tokens_per_pass": t.tokens_per_pass,
            "tokens": t.tokens,
            "passes": t.passes,
            "histogram": {k: t.histogram[k] for k in sorted(t.histogram)},
            "exact_match_with_tau1": sum(a.token_ids == b.token_ids for a, b in zip(ref, res)) / len(res),
            "prefix_match_with_tau1": sum(prefix_match(a.token_ids, b.token_ids) for a, b in zip(ref, res)) / len(res),
            "mean_nll_under_ar": sum(nll_self) / max(1, len(nll_self)),
            "mean_nll_under_bare": (sum(nll_bare) / len(nll_bare)) if nll_bare else None,
            "exact_match_with_bare": None if bare_ref is None else
            sum(a.token_ids == b.token_ids for a, b in zip(bare_ref, res)) / len(res),
            "prefix_match_with_bare": None if bare_ref is None else
            sum(prefix_match(a.token_ids, b.token_ids) for a, b in zip(bare_ref, res)) / len(res),
            "stutter": stutter_rate(texts, refs),
            "repeat_guard_stops": sum(s.repeat_guard for r in res for s in r.steps),
        }
        if known:
            row["known_answer_accuracy"] = known_answer_accuracy(run(known[0], tau), known[1])
        rows.append(row)
    return rows
