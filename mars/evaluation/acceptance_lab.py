"""The acceptance lab (issue 43): how good each mask depth's drafts are, measured teacher-forced on the
model's own greedy answers, for the adapter and for the bare model. Data out; the app and the CLI draw it.

1. answers: each prompt's greedy answer (AR; with a gated adapter that is the bare model's text), decoded in
   the layout below with every answer's KV kept (`greedy_answers`): the drafts read it, no clean forward again.
2. drafts: at EVERY position f of an answer (the AR token answer[f], the window's last real token before it
   visible), the B-1 masks of a pass are scored against answer[f+1], ..., answer[f+B-1]: depth j (1..B-1)
   drafts the token j places after the AR token, as the decoder's mask j-1 does. In the training layout
   with every frontier at once, one row of the cache:
       [clean copy of answer 1 | clean copy of answer 2 | ...]            (the answers' own KV, or one forward)
       [groups of B-1 masks, one group per (answer, frontier)]            (one forward per variant and pack)
   A group at frontier f sees its own answer's clean tokens before f and the group's earlier masks (causal
   inside the group), nothing else: the rules of mars.decoding.masks with the block grid shifted to f (the
   training layout's shifted noisy copies, one per offset, without the last slot no pass reads). Answers
   are packed into one row, positions restarting per answer, so there is no padding. The bare model's
   groups read the same clean KV: with a gated adapter real tokens run the bare model either way.
3. analysis (`analyse`): per depth a reliability table (binned confidence against the share right, with
   counts) and its expected calibration error; accuracy and confidence by depth; the tokens per pass these
   predict at each tau (the decoder's own acceptance rule, repeat guard included, applied to the drafts);
   acceptance by token class; the ten most confident wrong drafts and the ten right drafts just under tau.

The measured tokens per pass (decoding the same prompts at each tau) come from mars.app.sweep.sweep_batch:
this module never decodes on its own.
"""

from __future__ import annotations

import csv
import io
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

MAX_PROMPTS = 16  # the app's and the CLI's cap: 16 answers of 128 tokens take ~18-23 s on two cores (int8)
ROWS_PER_FORWARD = 1024  # mask rows per forward: a forward stays ~1 s on two cores (Stop acts between forwards)
# greedy_answers' steps between two gathers of each answer's KV; 16 x 128 stories, int8, 2 threads, min of 3 rounds
# interleaved: every 4 / 8 / 16 / 32 steps or never 4.80 / 4.23 / 4.05 / 4.22 / 4.44 s
GATHER_EVERY = 16
TOP = 10  # rows of each table
VARIANTS = ("model", "bare")  # as loaded (with its adapter), and with a gated adapter closed
CLASSES = ("word start", "word piece", "number", "punctuation", "code symbol", "other")
PROSE_PUNCT = set(".,;:!?'\"-()…–—‘’“”")  # what prose uses; the other symbols count as code


@dataclass
class Answer:
    """One prompt and the model's greedy answer to it (EOS included when it finished)."""

    prompt: str
    prompt_ids: list[int]
    answer_ids: list[int]
    finished: bool = True
    reused: bool = False  # taken from the visitor's last Generate run instead of generated here


@dataclass
class Drafts:
    """One variant's teacher-forced drafts: one entry per (answer, frontier, depth), sorted in that order."""

    variant: str
    block_size: int
    example: torch.Tensor  # (n,) long: index of the answer
    frontier: torch.Tensor  # (n,) long: index in the answer of the pass's AR token
    depth: torch.Tensor  # (n,) long, 1..B-1: the draft is scored against answer[frontier + depth]
    conf: torch.Tensor  # (n,) float32: p(draft), calibrated as decoding calibrates it
    pred: torch.Tensor  # (n,) long: the draft (argmax)
    target: torch.Tensor  # (n,) long: the answer's token there

    @property
    def right(self) -> torch.Tensor:
        return self.pred == self.target


def draft_rows(answer_len: int, block_size: int) -> list[tuple[int, int]]:
    """(frontier, depth) of every draft scored in an answer of `answer_len` tokens, in window order."""
    return [(f, j) for f in range(answer_len) for j in range(1, block_size) if f + j < answer_len]


@dataclass
class CleanKV:
    """The answers' clean keys and values in one row of `runner`'s cache (the module doc's layout), for the
    drafts to read: per answer its columns in position order (its prompt, then its answer but the last token:
    all a draft may see). `greedy_answers` leaves them so; `length` columns in all."""

    runner: object
    cols: list[list[int]]
    length: int


@dataclass
class Pack:
    """Answers whose drafts share a forward (see the module doc): the mask forward's inputs and mask (its keys:
    the clean columns, then its own), and, where the clean KV is not there yet (`clean_ids` not None), the
    clean forward's inputs and mask."""

    examples: list[int]
    mask_pos: torch.Tensor  # (1, N)
    mask_allowed: torch.Tensor  # (1, N, Lc + N) bool
    rows: list[tuple[int, int, int]]  # per mask row: (example, frontier, depth)
    targets: torch.Tensor  # (N,) long
    clean_ids: torch.Tensor | None = None  # (1, Lc)
    clean_pos: torch.Tensor | None = None  # (1, Lc)
    clean_allowed: torch.Tensor | None = None  # (1, Lc, Lc) bool


def side_by_side(seqs: list[list[int]]) -> tuple[list[int], list[int], torch.Tensor, list[list[int]]]:
    """Token sequences in one row of the layout (module doc): (ids, positions restarting per sequence, the mask
    (L, L) bool, causal inside each sequence and nothing across, each sequence's columns)."""
    ids, pos, seg, cols = [], [], [], []
    for e, seq in enumerate(seqs):
        cols.append(list(range(len(ids), len(ids) + len(seq))))
        ids += seq
        pos += range(len(seq))
        seg += [e] * len(seq)
    seg_t, col = torch.tensor(seg, dtype=torch.long), torch.arange(len(ids))
    return ids, pos, (seg_t[:, None] == seg_t[None, :]) & (col[None, :] <= col[:, None]), cols


def build_pack(answers: list[Answer], examples: list[int], block_size: int, clean: CleanKV | None = None) -> Pack:
    """The forwards' inputs for answers `examples` (indices into `answers`): the mask forward over `clean`'s
    columns, or over a clean copy of these answers laid out here (clean None)."""
    B = block_size
    fresh = clean is None
    if fresh:  # the pack's own clean copy: its answers side by side, each causal on its own
        ids, pos, clean_allowed, own = side_by_side([list(answers[e].prompt_ids) + list(answers[e].answer_ids)
                                                     for e in examples])
        cols, Lc = dict(zip(examples, own)), len(ids)
    else:
        cols, Lc = clean.cols, clean.length
    rows, targets, mpos, limit, group, spans = [], [], [], [], [], []
    g = 0
    for e in examples:
        a = answers[e]
        P, r0 = len(a.prompt_ids), len(rows)
        for f, j in draft_rows(len(a.answer_ids), B):
            if j == 1:
                g += 1
            rows.append((e, f, j))
            targets.append(a.answer_ids[f + j])
            mpos.append(P + f + j - 1)  # the mask right after the AR token's column P + f, as in a pass
            limit.append(P + f)  # the answer's first P + f clean columns: the prompt and answer[:f]
            group.append(g)
        spans.append((e, r0, len(rows)))
    N = len(rows)
    to_clean = torch.zeros(N, Lc, dtype=torch.bool)
    lim = torch.tensor(limit, dtype=torch.long)
    for e, r0, r1 in spans:
        if r1 > r0:
            c = torch.tensor(cols[e][: int(lim[r0:r1].max())], dtype=torch.long)
            to_clean[r0:r1, c] = torch.arange(len(c))[None, :] < lim[r0:r1, None]
    grp, r = torch.tensor(group), torch.arange(N)
    to_own = (grp[:, None] == grp[None, :]) & (r[None, :] <= r[:, None])  # (N, N): causal inside the group
    pack = Pack(list(examples), torch.tensor([mpos]), torch.cat([to_clean, to_own], 1)[None], rows,
                torch.tensor(targets))
    if fresh:
        pack.clean_ids, pack.clean_pos, pack.clean_allowed = torch.tensor([ids]), torch.tensor([pos]), clean_allowed[None]
    return pack


def packs(answers: list[Answer], block_size: int, rows_per_forward: int = ROWS_PER_FORWARD) -> list[list[int]]:
    """Answers grouped into packs of at most `rows_per_forward` mask rows (an answer longer than that alone)."""
    out, cur, n = [], [], 0
    for e, a in enumerate(answers):
        k = len(draft_rows(len(a.answer_ids), block_size))
        if k == 0:
            continue
        if cur and n + k > rows_per_forward:
            out.append(cur)
            cur, n = [], 0
        cur.append(e)
        n += k
    return out + ([cur] if cur else [])


def score(logits: torch.Tensor, depths: torch.Tensor, temperatures=None, scoring=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(draft, confidence) per row of logits (N, V): argmax and p(argmax), each depth's logits divided by its
    calibration temperature first (mars.decoding.acceptance.calibrate_logits: mask j by temperatures[j-1]).
    `scoring`: the backend's one-call way to the uncalibrated case (mars.runtime.scoring), as decoding uses it."""
    if scoring is not None and not temperatures:
        fast = scoring.argmax_conf(logits)
        if fast is not None:
            return fast[0].long(), fast[1].float()
    z = logits.float()
    if temperatures:
        t = torch.tensor([1.0] + [float(x) for x in temperatures] + [1.0] * 64)
        z = z / t[depths.clamp(max=len(t) - 1)][:, None]
    mx, arg = z.max(-1)
    return arg, torch.exp(mx - torch.logsumexp(z, -1))


def teacher_forced(lm, answers: list[Answer], block_size: int, variants=("model",), *, runner_factory=None,
                   backend: str = "auto", run: Callable | None = None, control=None,
                   rows_per_forward: int = ROWS_PER_FORWARD,
                   clean: CleanKV | None = None) -> Iterator[tuple[int, int, dict | None]]:
    """Measure the drafts; yields (forwards done, forwards in all, None) after each forward and finally
    (done, total, {variant: Drafts}). Stops (yielding nothing more) once `control` is cancelled.

    clean: the answers' KV already in a runner (`greedy_answers`): the masks read it, no clean forward runs
    (the cache is left as it came). None: each pack's clean copy is computed first, in a runner of its own.

    run(fn, *args): where each forward runs (the app's model thread: `pass_slot.run`); default here.
    runner_factory(model, cfg, batch, capacity): what runs the model (the decoder's `backend=`; default the
    backend `backend` names, mars.decoding.decoder.make_runner). Variant "bare": the same model with its gated
    adapter closed (mars.models.gated.adapter_off); "model": as loaded, its adapter (if any) on.
    """
    from mars.decoding.decoder import DecodeConfig, make_runner
    from mars.models.gated import adapter_off

    run = run or (lambda fn, *a: fn(*a))
    for v in variants:
        if v not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {v!r}")
    if "bare" in variants and not lm.gated:
        raise ValueError("the bare model is measured by closing a gated adapter (one that acts at mask inputs "
                         "only); this model has none")
    cfg = DecodeConfig(mode="mars", block_size=block_size, backend=backend)
    temps = (getattr(lm, "calibration", None) or {}).get("temperatures")
    groups = packs(answers, block_size, rows_per_forward)
    total, done = len(groups) * (len(variants) + (clean is None)), 0
    found = {v: [] for v in variants}
    for ex in groups:
        pack = build_pack(answers, ex, block_size, clean)
        N = len(pack.rows)
        mask_ids = torch.full((1, N), lm.mask_token_id, dtype=torch.long)
        depths = torch.tensor([j for _, _, j in pack.rows])
        if control is not None and control.cancelled:
            return
        if clean is not None:
            runner, Lc = clean.runner, clean.length
        else:
            Lc = pack.clean_ids.shape[1]
            runner = (runner_factory or make_runner)(lm.model, cfg, 1, Lc + N)
            run(runner.forward, pack.clean_ids, pack.clean_pos, pack.clean_allowed, [Lc - 1])  # the KV the masks read
            done += 1
            yield done, total, None
        for v in variants:
            if control is not None and control.cancelled:
                return

            def masks(v=v):
                runner.truncate(Lc)  # the other variant's mask KV goes; the clean columns stay
                with adapter_off(lm.model) if v == "bare" else _nothing():
                    logits = runner.forward(mask_ids, pack.mask_pos, pack.mask_allowed, list(range(N)))[0]
                return score(logits, depths, temps, getattr(runner, "scoring", None))

            pred, conf = run(masks)
            found[v].append((pack, pred, conf))
            done += 1
            yield done, total, None
        if clean is not None:
            run(runner.truncate, Lc)  # the clean columns alone, as they came
    out = {}
    for v, parts in found.items():
        rows = [r for p, _, _ in parts for r in p.rows]
        t = torch.tensor(rows, dtype=torch.long).reshape(-1, 3)
        cat = (lambda xs, dt: torch.cat(xs) if xs else torch.zeros(0, dtype=dt))
        out[v] = Drafts(v, block_size, t[:, 0], t[:, 1], t[:, 2], cat([c for _, _, c in parts], torch.float32),
                        cat([p for _, p, _ in parts], torch.long), cat([p.targets for p, _, _ in parts], torch.long))
    yield done, total, out


def greedy_answers(lm, known: list[list[int]], todo: list[int], max_new: int, runner, run: Callable | None = None,
                   control=None):
    """Greedy answers for the answers `todo` (indices into `known`), decoded in one row of `runner`'s cache with
    every answer's KV kept: the module doc's layout, so the drafts need no clean forward of their own.

    known[e]: the tokens answer e's columns start with: its prompt (a reused answer: its prompt and its answer
    but the last token). A generator: yields LabProgress after each step (one forward through `run`), returns
    ({e: new token ids}, {e: ended at EOS}, CleanKV), or None once `control` is cancelled. The token is the
    decoder's AR choice (choose_and_score, greedy): the same text as mars.decoding.decoder's AR mode (tested),
    which cannot serve here as it drops a finished row's KV. Each answer's columns are put side by side (the
    runner's `gather`, where it has one) every GATHER_EVERY steps and at the end: a step appends one column per
    answer, and a query whose keys lie one in 16 columns reads 8 keys for each of its own."""
    from mars.decoding.acceptance import choose_and_score

    run = run or (lambda fn, *a: fn(*a))
    scoring = getattr(runner, "scoring", None)
    eos = set(lm.eos_token_ids)

    def step(ids, pos, allowed, keep):
        logits = runner.forward(torch.tensor([ids]), torch.tensor([pos]), allowed[None], keep)[0]
        return choose_and_score(logits, "prob", 0.0, None, scoring=scoring)[0].tolist()

    def tidy():
        if hasattr(runner, "gather"):
            run(runner.gather, [c for cs in cols for c in cs])
            at = 0
            for cs in cols:
                cs[:] = range(at, at + len(cs))
                at += len(cs)

    ids, pos, allowed, cols = side_by_side(known)  # the prefill: every answer's known tokens
    live = list(todo)
    got, eos_at = {e: [] for e in live}, {e: False for e in live}
    toks = run(step, ids, pos, allowed, [cols[e][-1] for e in live] or [len(ids) - 1])
    n = 0
    while live:
        for e, t in zip(live, toks):
            got[e].append(t)
            eos_at[e] = t in eos
        live = [e for e in live if not eos_at[e] and len(got[e]) < max_new]
        n += 1
        yield LabProgress("answers", n, max_new, f"generating {len(todo)} greedy answers")
        if control is not None and control.cancelled:
            return None
        if not live:
            break
        if n % GATHER_EVERY == 0:
            tidy()
        # each live answer feeds its last token; it sees its own columns and itself
        C = runner.length
        allowed = torch.zeros(len(live), C + len(live), dtype=torch.bool)
        for i, e in enumerate(live):
            allowed[i, cols[e]] = True
            allowed[i, C + i] = True
            cols[e].append(C + i)
        toks = run(step, [got[e][-1] for e in live], [len(known[e]) + len(got[e]) - 1 for e in live], allowed,
                   list(range(len(live))))
    tidy()
    return got, eos_at, CleanKV(runner, cols, sum(map(len, cols)))


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


# ------------------------------------------------------------------------------------------------ analysis


def reliability(conf: torch.Tensor, right: torch.Tensor, bins: int = 10) -> tuple[list[dict], float | None]:
    """Equal-width confidence bins (the last one closed): count, mean confidence, share right; and the
    expected calibration error, sum over bins of (count / n) |share right - mean confidence|."""
    n = len(conf)
    idx = (conf * bins).long().clamp(0, bins - 1)
    out, ece = [], 0.0
    for b in range(bins):
        sel = idx == b
        k = int(sel.sum())
        row = {"lo": b / bins, "hi": (b + 1) / bins, "count": k, "confidence": None, "accuracy": None}
        if k:
            c, a = float(conf[sel].double().mean()), float(right[sel].double().mean())
            row.update(confidence=c, accuracy=a)
            ece += k / n * abs(a - c)
        out.append(row)
    return out, (ece if n else None)


def frontier_table(d: Drafts, answers: list[Answer]) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, int]]]:
    """Per (answer, frontier): the drafts' confidences (F, B-1) (-1 where the answer has no token there) and
    the repeat flags of the pass's proposals [AR token, drafts] (F, B) under the decoder's repeat guard."""
    from mars.decoding.acceptance import repeat_flags_list

    B = d.block_size
    keys = [(e, f) for e, a in enumerate(answers) for f in range(len(a.answer_ids))]
    at = {k: i for i, k in enumerate(keys)}
    conf = torch.full((len(keys), B - 1), -1.0)
    pred = [[None] * (B - 1) for _ in keys]
    for e, f, j, c, p in zip(d.example.tolist(), d.frontier.tolist(), d.depth.tolist(), d.conf.tolist(),
                             d.pred.tolist()):
        i = at[(e, f)]
        conf[i, j - 1] = c
        pred[i][j - 1] = p
    repeats = torch.zeros(len(keys), B, dtype=torch.bool)
    for i, (e, f) in enumerate(keys):
        a = answers[e]
        props = [a.answer_ids[f]] + [p for p in pred[i] if p is not None]
        flags = repeat_flags_list(list(a.prompt_ids) + list(a.answer_ids[:f]), props)
        repeats[i, :len(flags)] = torch.tensor(flags)
    return conf, repeats, keys


def predicted_tokens_per_pass(d: Drafts, answers: list[Answer], taus: list[float],
                              repeat_tau: float | None = 1.0) -> list[dict]:
    """What the drafts predict, per tau: the decoder's acceptance rule (acceptance.accept_lengths, the repeat
    guard included) applied to every pass the answers offer.

    `predicted`: the mean accepted count over every position (1 + the sum over depths of the share of passes
    whose chain reaches that depth: `reach`); `walk`: tokens per pass of a walk along each answer taking each
    pass's count, as decoding would if every accepted draft were right (a wrong one changes the text, the
    measured numbers say by how much)."""
    from mars.decoding.acceptance import accept_lengths

    conf, repeats, keys = frontier_table(d, answers)
    full = torch.cat([torch.ones(len(keys), 1), conf], 1).float()  # column 0: the AR token, always accepted
    has = conf >= 0
    out = []
    for tau in taus:
        if not keys:
            out.append({"tau": tau, "predicted": None, "walk": None, "reach": []})
            continue
        n = accept_lengths(full, float(tau), None, repeats, repeat_tau)
        reach = [float(((n - 1 >= j) & has[:, j - 1]).sum() / max(1, int(has[:, j - 1].sum())))
                 for j in range(1, d.block_size)]
        passes, tokens, i = 0, 0, 0
        for e, a in enumerate(answers):
            f = 0
            while f < len(a.answer_ids):
                f += int(n[i + f])
                passes += 1
            tokens += len(a.answer_ids)
            i += len(a.answer_ids)
        out.append({"tau": tau, "predicted": float(n.float().mean()), "walk": tokens / max(1, passes),
                    "reach": reach})
    return out


def token_pieces(tokenizer, ids: list[int]) -> list[str]:
    """Each token's text as it joins the decoded whole (leading spaces of word starts included)."""
    out, prev = [], ""
    for i in range(len(ids)):
        text = tokenizer.decode(ids[: i + 1])
        out.append(text[len(prev):] if text.startswith(prev) else tokenizer.decode(ids[i:i + 1]))
        prev = text
    return out


def token_class(piece: str, before: str, special: bool = False) -> str:
    """The class of a token from its text (`piece`) and the text before it: a word's first piece (after a
    space, a line break or punctuation, or at the start), a word's later piece, a number, prose punctuation,
    a code symbol; "other" for whitespace and special tokens (EOS)."""
    core = piece.strip()
    if special or not core:
        return "other"
    if any(ch.isalpha() for ch in core):
        joined = piece[:1].isspace() or not before or not (before[-1].isalnum() or before[-1] == "_")
        return "word start" if joined else "word piece"
    if any(ch.isdigit() for ch in core) and all(ch.isdigit() or ch in ".,_" for ch in core):
        return "number"
    if all(ch in PROSE_PUNCT for ch in core):
        return "punctuation"
    return "code symbol"


def answer_texts(tokenizer, answers: list[Answer]) -> list[tuple[list[str], list[str]]]:
    """Per answer: each token's text and class."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    out = []
    for a in answers:
        pieces = token_pieces(tokenizer, list(a.answer_ids))
        classes, before = [], ""
        for t, p in zip(a.answer_ids, pieces):
            classes.append(token_class(p, before, t in special))
            before += p
        out.append((pieces, classes))
    return out


def analyse(drafts: Drafts, answers: list[Answer], tokenizer, tau: float = 0.9, taus: list[float] | None = None,
            bins: int = 10, repeat_tau: float | None = 1.0, texts=None) -> dict:
    """Everything the tab and the CLI show of one variant, as plain data (see the module doc)."""
    d = drafts
    right = d.right
    texts = texts if texts is not None else answer_texts(tokenizer, answers)
    grid = sorted(set([round(i / 20, 2) for i in range(21)] + [float(t) for t in (taus or [])] + [float(tau)]))
    bins_all, ece_all = reliability(d.conf, right, bins)
    depths = []
    for j in range(1, d.block_size):
        sel = d.depth == j
        k = int(sel.sum())
        table, ece = reliability(d.conf[sel], right[sel], bins)
        acc = float(right[sel].double().mean()) if k else None
        conf = float(d.conf[sel].double().mean()) if k else None
        depths.append({"depth": j, "count": k, "accuracy": acc, "confidence": conf, "ece": ece,
                       "overconfidence": None if acc is None else conf - acc, "bins": table})
    cls = [texts[e][1][f + j] for e, f, j in zip(d.example.tolist(), d.frontier.tolist(), d.depth.tolist())]
    accepted = d.conf >= torch.tensor(tau, dtype=torch.float32)
    classes = []
    for c in CLASSES:
        sel = torch.tensor([x == c for x in cls], dtype=torch.bool)
        k = int(sel.sum())
        classes.append({"class": c, "count": k,
                        "accuracy": float(right[sel].double().mean()) if k else None,
                        "confidence": float(d.conf[sel].double().mean()) if k else None,
                        "accepted": float(accepted[sel].double().mean()) if k else None,
                        "accepted_right": float((accepted & right)[sel].double().mean()) if k else None})

    def rows(sel: torch.Tensor, descending: bool) -> list[dict]:
        idx = sel.nonzero().flatten()
        order = idx[torch.argsort(d.conf[idx], descending=descending, stable=True)][:TOP]
        out = []
        for i in order.tolist():
            e, f, j = int(d.example[i]), int(d.frontier[i]), int(d.depth[i])
            pieces = texts[e][0]
            out.append({"prompt_index": e, "prompt": answers[e].prompt, "position": f, "depth": j,
                        "confidence": float(d.conf[i]), "before": "".join(pieces[:f])[-60:],
                        "pass": "".join(pieces[f:f + j]), "draft": tokenizer.decode([int(d.pred[i])]),
                        "right": pieces[f + j], "class": texts[e][1][f + j]})
        return out

    return {
        "variant": d.variant, "drafts": len(d.conf), "accuracy": float(right.double().mean()) if len(right) else None,
        "confidence": float(d.conf.double().mean()) if len(right) else None, "ece": ece_all, "bins": bins_all,
        "depths": depths, "classes": classes,
        "tokens_per_pass": predicted_tokens_per_pass(d, answers, grid, repeat_tau),
        "confident_wrong": rows(~right, True),
        "right_under_tau": rows(right & ~accepted, True),
    }


# ------------------------------------------------------------------------------------------------ the run


@dataclass
class LabConfig:
    """One lab run's settings (checked once, here)."""

    block_size: int = 4
    max_new_tokens: int = 128
    tau: float = 0.9  # the tables' and the token classes' tau
    taus: tuple[float, ...] = (0.9, 0.7, 0.5)  # measured by decoding (the sweep); () = predicted only
    compare: bool = True  # bare and adapter side by side (needs a gated adapter)
    bare_only: bool = False
    bins: int = 10
    backend: str = "auto"
    rows_per_forward: int = ROWS_PER_FORWARD

    def __post_init__(self):
        from mars.decoding.decoder import MAX_BLOCK_SIZE, check_int, check_tau

        self.block_size = check_int("block size", self.block_size, 2, MAX_BLOCK_SIZE)
        self.max_new_tokens = check_int("max new tokens", self.max_new_tokens, 1, 4096)
        self.tau = check_tau(self.tau)
        self.taus = tuple(check_tau(t) for t in self.taus)
        self.bins = check_int("bins", self.bins, 2, 100)
        self.rows_per_forward = check_int("rows per forward", self.rows_per_forward, 16, 1 << 20)


@dataclass
class LabProgress:
    stage: str  # "answers", "drafts", "decoding", "done"
    done: int
    total: int
    note: str = ""
    result: dict | None = None
    seconds: dict = field(default_factory=dict)
    # from the "analysed" stage on: the answers the result measured (their ids: what the app needs to decode a
    # table row's pass again, mars.app.accept_inspect); not in the result, which is the download
    answers: list[Answer] | None = None


def variants_of(lm, cfg: LabConfig) -> tuple[str, ...]:
    """Which models the run measures: "model" (as loaded, with its adapter), and beside it "bare" (the gated
    adapter closed) where the adapter is gated and the comparison asked for; "bare" alone for `bare_only`."""
    if cfg.bare_only:
        if not lm.gated:
            raise ValueError("--bare closes a gated adapter; this model has none (it is measured as it is)")
        return ("bare",)
    if cfg.compare and lm.gated:
        return ("model", "bare")
    return ("model",)


def run_lab(lm, prompts: list[str], prompt_ids: list[list[int]], cfg: LabConfig, *, run: Callable | None = None,
            control=None, runner_factory=None, reuse: dict | None = None,
            describe: dict | None = None) -> Iterator[LabProgress]:
    """The whole lab, one forward at a time through `run` (the app's model thread); yields progress, and last
    a LabProgress("done", result=the data). `reuse`: {prompt text: answer ids} already generated greedily
    with these settings (the visitor's last Generate), not generated again."""
    from mars.app.sweep import sweep_batch
    from mars.decoding.decoder import DecodeConfig, check_context, make_runner

    if lm.mask_token_id is None:
        raise ValueError("this model has no mask token: it has no drafts to measure")
    if not 1 <= len(prompt_ids) <= MAX_PROMPTS or len(prompts) != len(prompt_ids):
        raise ValueError(f"give 1 to {MAX_PROMPTS} prompts")
    run = run or (lambda fn, *a: fn(*a))
    reuse = reuse or {}
    seconds = {}
    variants = variants_of(lm, cfg)

    # 1. the greedy answers, their KV kept for the drafts (one AR step a call)
    t0 = time.perf_counter()
    answers: list[Answer | None] = [None] * len(prompts)
    known, todo = [], []
    for i, (p, ids) in enumerate(zip(prompts, prompt_ids)):
        if p in reuse:
            ans = list(reuse[p]["ids"])[: cfg.max_new_tokens]
            answers[i] = Answer(p, list(ids), ans, reuse[p]["finished"], True)
            known.append(list(ids) + ans[:-1])
        else:
            todo.append(i)
            known.append(list(ids))
    ar = DecodeConfig(mode="ar", block_size=1, max_new_tokens=cfg.max_new_tokens, backend=cfg.backend)
    check_context(lm.model, max(len(k) for k in known), ar)
    capacity = sum(map(len, known)) + len(todo) * cfg.max_new_tokens + cfg.rows_per_forward
    runner = (runner_factory or make_runner)(lm.model, ar, 1, capacity)
    got = yield from greedy_answers(lm, known, todo, cfg.max_new_tokens, runner, run, control)
    if got is None or (control is not None and control.cancelled):
        return
    tokens, eos_at, clean = got
    for i in todo:
        answers[i] = Answer(prompts[i], list(prompt_ids[i]), tokens[i], eos_at[i])
    seconds["answers"] = time.perf_counter() - t0

    # 2. the drafts, teacher-forced
    t0 = time.perf_counter()
    drafts = None
    for done, total, found in teacher_forced(lm, answers, cfg.block_size, variants, runner_factory=runner_factory,
                                             backend=cfg.backend, run=run, control=control,
                                             rows_per_forward=cfg.rows_per_forward, clean=clean):
        if found is None:
            yield LabProgress("drafts", done, total, f"measuring the drafts ({' and '.join(variants)})")
        drafts = found
    if drafts is None or (control is not None and control.cancelled):
        return
    seconds["drafts"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    texts = answer_texts(lm.tokenizer, answers)
    result = {
        "settings": {"block_size": cfg.block_size, "max_new_tokens": cfg.max_new_tokens, "tau": cfg.tau,
                     "taus": list(cfg.taus), "bins": cfg.bins, "backend": cfg.backend,
                     "repeat_tau": DecodeConfig.repeat_tau, "variants": list(variants)},
        "model": describe or {},
        "answers": [{"prompt": a.prompt, "tokens": len(a.answer_ids), "finished": a.finished, "reused": a.reused,
                     "text": "".join(t[0])} for a, t in zip(answers, texts)],
        "variants": {v: analyse(d, answers, lm.tokenizer, cfg.tau, list(cfg.taus), cfg.bins,
                                DecodeConfig.repeat_tau, texts) for v, d in drafts.items()},
        "measured": [],
    }
    seconds["analysis"] = time.perf_counter() - t0
    result["seconds"] = dict(seconds)
    yield LabProgress("analysed", 1, 1, "drafts measured", result, dict(seconds), answers)

    # 3. measured: the same prompts decoded at each tau of the sweep (the adapter's drafts, as the app decodes)
    if cfg.taus and "model" in variants:
        t0 = time.perf_counter()
        base = DecodeConfig(mode="mars", block_size=cfg.block_size, max_new_tokens=cfg.max_new_tokens,
                            backend=cfg.backend)
        for i, rows in enumerate(sweep_batch(lm, prompt_ids, base, list(cfg.taus), control, run, runner_factory)):
            result["measured"] = join_measured(rows, result["variants"]["model"]["tokens_per_pass"])
            yield LabProgress("decoding", i + 1, len(cfg.taus), "decoding the prompts at each τ", result,
                              answers=answers)
        if control is not None and control.cancelled:
            return
        seconds["decoding"] = time.perf_counter() - t0
        result["seconds"] = dict(seconds)
    yield LabProgress("done", 1, 1, "done", result, dict(seconds), answers)


def join_measured(rows: list[dict], predicted: list[dict]) -> list[dict]:
    """Each measured tau beside what the drafts predicted there, and the gap (measured - predicted)."""
    at = {round(p["tau"], 6): p for p in predicted}
    out = []
    for r in rows:
        p = at.get(round(r["tau"], 6), {})
        pred = p.get("predicted")
        out.append(dict(r, predicted=pred, walk=p.get("walk"),
                        gap=None if pred is None else r["tokens_per_pass"] - pred))
    return out


# ------------------------------------------------------------------------------------------------ files


def to_csv(result: dict) -> str:
    """The result as one long CSV table: table, variant, depth, key, count, confidence, accuracy, value."""
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["table", "variant", "depth", "key", "count", "confidence", "accuracy", "value"])
    for v, a in result["variants"].items():
        w.writerow(["summary", v, "", "all", a["drafts"], a["confidence"], a["accuracy"], a["ece"]])
        for d in a["depths"]:
            w.writerow(["depth", v, d["depth"], "all", d["count"], d["confidence"], d["accuracy"], d["ece"]])
            for b in d["bins"]:
                w.writerow(["reliability", v, d["depth"], f'{b["lo"]:.2f}-{b["hi"]:.2f}', b["count"],
                            b["confidence"], b["accuracy"], ""])
        for t in a["tokens_per_pass"]:
            w.writerow(["predicted_tokens_per_pass", v, "", t["tau"], "", "", "", t["predicted"]])
        for c in a["classes"]:
            w.writerow(["class", v, "", c["class"], c["count"], c["confidence"], c["accuracy"], c["accepted"]])
        for name in ("confident_wrong", "right_under_tau"):
            for r in a[name]:
                w.writerow([name, v, r["depth"], f'{r["before"]}|{r["pass"]}|{r["right"]} (draft {r["draft"]})',
                            "", r["confidence"], "", r["prompt_index"]])
    for m in result.get("measured", []):
        w.writerow(["measured_tokens_per_pass", "model", "", m["tau"], m["passes"], "", "", m["tokens_per_pass"]])
    return out.getvalue()


def summary_lines(result: dict) -> list[str]:
    """A few lines for a terminal."""
    lines = []
    for v, a in result["variants"].items():
        depth = ", ".join(f'd{d["depth"]}: acc {d["accuracy"]:.2f} conf {d["confidence"]:.2f} ECE {d["ece"]:.3f}'
                          for d in a["depths"] if d["count"])
        lines.append(f'{v}: {a["drafts"]} drafts, ECE {a["ece"]:.3f}; {depth}')
        tp = {round(t["tau"], 2): t for t in a["tokens_per_pass"]}
        lines.append("  predicted tokens/pass: " + ", ".join(
            f'tau {t:.2f}: {tp[t]["predicted"]:.2f}' for t in sorted(tp, reverse=True) if t in (0.9, 0.7, 0.5)))
    for m in result.get("measured", []):
        lines.append(f'measured at tau {m["tau"]:.2f}: {m["tokens_per_pass"]:.2f} tokens/pass '
                     f'(predicted {m["predicted"]:.2f}, gap {m["gap"]:+.2f})')
    return lines
