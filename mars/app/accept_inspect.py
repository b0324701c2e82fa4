"""A row of the Acceptance tab's table opened in the Generate tab's pass inspector (issue 43, item 3).

A row is one draft the lab scored teacher-forced: prompt e, frontier f (the pass's AR token is answer[f]),
depth j (the mask that drafts answer[f + j]). The pass it comes from is a decoding pass whose context is the
prompt and answer[:f]: its masks see exactly what the lab's mask group saw, so its mask j proposes the row's
draft with the row's confidence. That pass is decoded once, on demand, by the decoder itself (`decode_steps`,
its first pass) on the app's model thread, and drawn by the inspector's own renderer (mars.app.viz), with
the row's mask marked and acceptance at the visitor's current tau.

What a visitor's session keeps of their last run to do so is `LabCases` (the answers' ids are not in the
lab's result, which is the download); a row names its run, so a row of an older table, or of a model since
replaced, gets a message instead of another pass's numbers.
"""

from __future__ import annotations

import contextlib
import re
import weakref
from dataclasses import dataclass, field

from mars.app import viz
from mars.evaluation.acceptance_lab import Answer

KINDS = ("confident_wrong", "right_under_tau")  # the table's two lists (the lab's result keys)
TITLES = {"confident_wrong": "confident and wrong", "right_under_tau": "right but under τ"}
CONTEXT_CHARS = 400  # the answer before the pass, shown up to this many characters (its end)
_KEY = re.compile(r"(\d{1,9}):([a-z_]{1,32}):(\d{1,4})")


@dataclass
class LabCases:
    """What a visitor's session keeps of their last lab run, to decode a table row's pass again."""

    run: int  # the run's number in the session: the table's controls carry it, so an older table's row is caught
    model: weakref.ref  # the model measured; weak, so that a replaced model is not kept alive by a session
    model_name: str
    variant: str  # the table's variant ("model": with its adapter; "bare": the gated adapter closed)
    block_size: int
    backend: str
    answers: list[Answer] = field(repr=False)
    rows: dict = field(repr=False)  # kind -> the table's rows (the lab's result's lists)


def keep_cases(run: int, lm, result: dict, answers: list[Answer], variant: str | None = None) -> LabCases:
    """The LabCases of a lab `result` (run_lab's data) and its answers, measured on `lm`."""
    variant = variant or next(iter(result["variants"]))
    s = result["settings"]
    return LabCases(run, weakref.ref(lm), str(getattr(lm, "name", "")), variant, int(s["block_size"]),
                    str(s["backend"]), list(answers), {k: list(result["variants"][variant][k]) for k in KINDS})


def case_key(run: int, kind: str, index: int) -> str:
    """What a table row's control sends: its run, its list and its place there."""
    return f"{run}:{kind}:{index}"


def find_case(cases: LabCases | None, key, lm) -> tuple[str, dict, Answer]:
    """(the row's list, the row, its answer) that `key` names, from the session's last run on the current model
    `lm`; ValueError with a message the visitor can act on for anything else."""
    if cases is None:
        raise ValueError("there is no lab run to inspect yet: press Analyse, then a row's inspect")
    m = _KEY.fullmatch(str(key or "").strip())
    if m is None or m.group(2) not in KINDS:
        raise ValueError(f"not a row of the lab's table: {str(key)[:40]!r}" if key else
                         "not a row of the lab's table: no row was named (press a row's inspect button)")
    run, kind, i = int(m.group(1)), m.group(2), int(m.group(3))
    if run != cases.run:
        raise ValueError("this row is from an earlier lab run, whose table has been replaced: inspect a row of "
                         "the table shown now")
    if cases.model() is not lm:
        raise ValueError(f"the model has changed since this lab run (it measured {viz.hide_paths(cases.model_name)}): "
                         "press Analyse again to inspect the new model's drafts")
    rows = cases.rows[kind]
    if i >= len(rows):
        raise ValueError(f"not a row of the lab's table: {kind} has {len(rows)} rows")
    row = rows[i]
    return kind, row, cases.answers[row["prompt_index"]]


def case_pass(lm, answer: Answer, frontier: int, block_size: int, tau: float, *, variant: str = "model",
              backend: str = "auto", top_k: int = 5, run=None, runner_factory=None):
    """The decoding pass at `frontier` of `answer` (a PassRecord): the decoder's first pass on the prompt and
    answer[:frontier], at B = block_size and `tau`, with `top_k` candidates per proposal. Its AR token is the
    model's own choice (answer[frontier] when the answer is this model's greedy text); its mask j drafts
    answer[frontier + j] teacher-forced, as the lab scored it. run(fn): where the forward runs (the app's model
    thread, `pass_slot.run`); runner_factory: what runs the model (the decoder's `backend=`)."""
    from mars.decoding.decoder import DecodeConfig, decode_steps
    from mars.models.gated import adapter_off

    if not 0 <= frontier < len(answer.answer_ids):
        raise ValueError(f"position {frontier} is not in the answer ({len(answer.answer_ids)} tokens)")
    # one more token allowed than a pass proposes: a pass that accepts all B ends at its window, not at the length
    cfg = DecodeConfig(mode="mars", block_size=block_size, tau=tau, max_new_tokens=block_size + 1, top_k=top_k,
                       backend=backend, confidence="prob")
    steps = decode_steps(lm, [list(answer.prompt_ids) + list(answer.answer_ids[:frontier])], cfg,
                         backend=runner_factory)

    def first():
        try:
            with adapter_off(lm.model) if variant == "bare" else contextlib.nullcontext():
                return next(steps)
        finally:
            steps.close()

    records = (run or (lambda fn: fn()))(first)
    return records[0]


def render_case_html(rec, row: dict, kind: str, answer: Answer, tokenizer, block_size: int) -> str:
    """The inspector's table of the case's pass (viz.render_inspector_html), the row's mask marked, under the
    pass's context: the prompt and the answer before the AR token."""

    def decode(t):
        return tokenizer.decode([t])

    j, f = row["depth"], row["position"]
    proposals = list(rec.token_ids) + list(rec.rejected_token_ids)
    n = len(rec.token_ids)
    header = (f"Acceptance lab, prompt {row['prompt_index'] + 1}, answer token {f}: the pass there, at B = "
              f"{block_size}: {n} of {len(proposals)} proposals accepted at tau {rec.tau:.2f}. Marked: mask +{j}, "
              f"the table's draft ({TITLES.get(kind, kind)}, confidence {row['confidence']:.3f} in the lab).")
    notes = []
    if proposals and f < len(answer.answer_ids) and proposals[0] != answer.answer_ids[f]:
        notes.append(f"the model's own AR token here, {viz.token_label(decode(proposals[0]))}, is not the answer's "
                     f"{viz.token_label(decode(answer.answer_ids[f]))}; the masks are unchanged by it (they see "
                     "the text before it only)")
    before = tokenizer.decode(list(answer.answer_ids[:f]))
    if len(before) > CONTEXT_CHARS:
        before = "…" + before[-CONTEXT_CHARS:]
    context = (f'<div class="mars-note mars-case-context" data-prompt="{row["prompt_index"]}" data-position="{f}" '
               f'data-depth="{j}"><b>prompt</b>: {viz.esc(answer.prompt)}<br><b>answer before the pass</b>: '
               f'<span style="white-space:pre-wrap">{viz.esc(before)}</span></div>')
    extra = "".join(f'<div class="mars-note">{viz.esc(x)}</div>' for x in notes)
    table = viz.render_inspector_html(viz.inspector_rows(rec, decode), viz.chain_stop_reason(rec, block_size),
                                      marked=j)
    return f"<div>{viz.esc(header)}</div>" + context + extra + table

