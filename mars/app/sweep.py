"""One run of a prompt per tau, each compared with the AR output (exact-prefix agreement, AR model's NLL)."""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

from mars.decoding.decoder import DecodeConfig, DecodeControl, check_tau
from mars.decoding.records import RunRecord


def parse_taus(text: str) -> list[float]:
    try:
        taus = [check_tau(float(x)) for x in str(text).replace(";", ",").split(",") if x.strip()]
    except ValueError as e:
        raise ValueError(f"taus must be comma-separated numbers between 0 and 1 ({e})") from None
    if not taus or len(taus) > 10:
        raise ValueError("give between 1 and 10 values of tau, e.g. 1.0, 0.9, 0.8, 0.7, 0.5")
    return taus


def sweep(holder, lm, prompt_ids: list[int], base: DecodeConfig, taus: list[float], control: DecodeControl,
          reference: list[int] | None = None) -> Iterator[list[dict]]:
    """Run the prompt once per tau; yield the growing table of {tau, passes, tokens, tokens_per_pass,
    seconds, agreement, nll}. Quality is measured against AR's output (`reference`, else an AR run first):
    exact-prefix agreement, and the AR model's mean NLL of each text."""
    from mars.evaluation.quality import mean_nll, prefix_agreement

    def run(cfg) -> RunRecord:
        return RunRecord(cfg, list(prompt_ids)).add(holder.passes(lm, prompt_ids, cfg, control))

    if reference is None:
        reference = run(replace(base, mode="ar")).token_ids
    rows: list[dict] = []
    for tau in taus:
        if control.cancelled:
            return
        r = run(replace(base, mode="mars", tau=tau))
        if control.cancelled or not r.tokens:
            return
        nll = holder.pass_slot.run(mean_nll, lm, prompt_ids, r.token_ids)  # a forward pass: on the model thread
        rows.append({"tau": tau, "passes": r.passes, "tokens": r.tokens, "tokens_per_pass": r.tokens_per_pass,
                     "seconds": r.decode_seconds, "agreement": prefix_agreement(reference, r.token_ids), "nll": nll})
        yield list(rows)


def sweep_batch(lm, prompt_ids: list[list[int]], base: DecodeConfig, taus: list[float], control: DecodeControl | None,
                run=None, backend=None) -> Iterator[list[dict]]:
    """Several prompts at each tau, decoded as one batch (decode_steps: each row's tokens and passes are the
    ones it gets decoded alone, mars.app.batch checks it); yield the growing table of {tau, passes, tokens,
    tokens_per_pass, seconds}, passes counted per row as in `sweep`. `run(fn, *args)`: where each pass runs
    (the app's model thread: `pass_slot.run`); `backend`: the decoder's."""
    from mars.decoding.decoder import decode_steps
    from mars.decoding.records import RunTotals

    run = run or (lambda fn, *a: fn(*a))
    rows: list[dict] = []
    for tau in taus:
        if control is not None and control.cancelled:
            return
        cfg = replace(base, mode="mars", tau=tau)
        runs = [RunRecord(cfg, list(p)) for p in prompt_ids]
        steps = decode_steps(lm, prompt_ids, cfg, control, backend=backend)
        while (records := run(next, steps, None)) is not None:
            for rec in records:
                runs[rec.row].add(rec)
        if control is not None and control.cancelled:
            return
        t = RunTotals.of(runs)
        rows.append({"tau": tau, "passes": t.passes, "tokens": t.tokens, "tokens_per_pass": t.tokens_per_pass,
                     "seconds": t.batch_seconds})
        yield list(rows)
