"""What a wider pass costs on this machine, measured: the tree's size follows it (DecodeConfig.pass_costs).

A tree pass pays for every input it sends, and how much depends on the machine, not the model: on two cores
with AMX a pass of 8 inputs cost about what one input costs; on two AVX-512 cores without it (AMD EPYC) each
input past the first adds ~0.8 ms to a 5 ms int8 pass (benchmarks/kernel_ab.py --stages: 1 input 5.07 ms, 4
inputs 6.81, 8 inputs 10.71), and a mask input (the gated adapter's delta) ~0.5 ms more. A fixed tree is right
for one of them only. So the app times a few passes of each width once, at warm-up, and every tree then sends
the nodes that pay for their inputs, and its mask group only when the group's drafts pay for it (tree.TreeMode).

The passes have the tree's shape: the last real token, drafts as real tokens, and for the group's cost the
same with the last input a mask; every input's logits read, over a cached context of `context` tokens, KV
dropped after each. Shapes interleave round by round, so a load that comes and goes falls on all. A
least-squares line through the medians gives the table: one slow round cannot make width 3 look dearer than
width 4, and the cut needs only the slope.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from mars.decoding.cache import BlockCache


def context_ids(lm, context: int) -> list[int]:
    """A context of `context` token ids (their values do not change a pass's cost)."""
    vocab = lm.model.config.vocab_size
    return [(1000 + 7 * i) % vocab for i in range(context)]


def time_widths(lm, backend: str, widths: list[int], context: int = 128, rounds: int = 5,
                masks: tuple[bool, ...] = (False,)) -> dict[tuple[int, bool], float]:
    """Median seconds of a pass of each width over a cached context (one row, batch 1): (width, mask) -> s, where
    with mask True a pass's last input (of 2 or more) is the mask token, as a tree's one mask group at B 2."""
    prompt = context_ids(lm, context)
    from mars.runtime.backends import make_backend  # what runs the model: the decoder's own default

    runner = make_backend(lm.model, backend, 1, context + max(widths) + 1)
    cache = BlockCache(runner, context, 1, context, True)
    with torch.inference_mode():
        n = context
        cache.forward(torch.tensor([prompt]), torch.arange(n)[None], torch.ones(1, n, n, dtype=torch.bool).tril(),
                      [n - 1])
        cache.commit([0], [n - 1])  # the context's KV, all but its last token: every pass feeds that one first
        shapes = [(w, m) for w in widths for m in masks if w > 1 or not m]
        times: dict[tuple[int, bool], list[float]] = {shape: [] for shape in shapes}
        for r in range(rounds + 1):  # round 0 warms each width's kernels up and is not counted
            for w, mask in shapes:
                ids = [prompt[-1]] + [prompt[(j * 13) % n] for j in range(w - 1)]
                if mask:
                    ids[-1] = lm.mask_token_id
                local = torch.ones(1, w, w, dtype=torch.bool).tril()
                t0 = time.perf_counter()
                cache.forward(torch.tensor([ids]), torch.arange(n - 1, n - 1 + w)[None], local, list(range(w)))
                took = time.perf_counter() - t0
                cache.commit([0], [0])  # drop the pass's KV: the next pass sees the same context
                if r:
                    times[(w, mask)].append(took)
    return {shape: statistics.median(t) for shape, t in times.items()}


def fit_costs(medians: dict[int, float], max_width: int) -> tuple[float, ...]:
    """Relative costs for widths 1..max_width from measured medians: the least-squares line a + b (w - 1),
    its slope kept at 0 or more, divided by its value at one input."""
    ws = sorted(medians)
    if len(ws) == 1:
        return (1.0,) * max_width
    xs, ys = [w - 1 for w in ws], [medians[w] for w in ws]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs))
    base = my - slope * mx
    if base <= 0:  # a line through noise can cross zero: then call every width the same
        return (1.0,) * max_width
    return tuple(1.0 + slope * (w - 1) / base for w in range(1, max_width + 1))


def host_seconds(lm, backend: str, context: int = 128, passes: int = 12) -> float:
    """Median seconds of a whole AR decoding step over the same context: its forward and the decoder's host work
    around it (plan, score, accept, records); the caller subtracts the forward's own time."""
    from mars.decoding.decoder import DecodeConfig, generate_ids

    cfg = DecodeConfig(mode="ar", tau=1.0, block_size=1, max_new_tokens=passes, backend=backend)
    steps = generate_ids(lm, [context_ids(lm, context)], cfg)[0].steps[1:]  # the first pass runs the prompt
    return statistics.median(s.seconds for s in steps) if steps else 0.0


@dataclass(frozen=True)
class PassCosts:
    """A decoding step's cost on this machine, relative to a step of one input: `by_width[w-1]` for w real inputs
    (DecodeConfig.pass_costs), and `group` what a step pays on top when some of its inputs are masks (the gated
    adapter's delta at those rows; DecodeConfig.group_cost)."""

    by_width: tuple[float, ...]
    group: float


WIDE_WIDTHS = (16, 32, 64, 128)  # wide passes measured too: a room's shared pass (mars.decoding.scheduler)
DRIFT_WIDTHS = 8  # the passes that check a table: a tree's own (a row alone); a prompt's long pass is no step


def measure_pass_costs(lm, backend: str, max_width: int = 8, context: int = 128, rounds: int = 5,
                       wide: tuple[int, ...] = WIDE_WIDTHS) -> PassCosts:
    """This machine's PassCosts for `lm` on `backend`: the forward's time by width, with and without a mask, plus
    the decoder's host work around it, which every step pays alike (an int8 AR step here: 4.2 ms forward, little
    around it). ~0.8 s for the default int8 model on two cores, and ~1 s more for the `wide` widths.

    Up to max_width the table is a line through the medians (a tree's own pass). Past it, where a room's shared
    pass lies, the line no longer holds: a narrow int8 pass streams its weights (an input more: +4% here), a wide
    one is bound by its products (+11% an input at 64 inputs on two AVX-512 cores), so the line's slope would
    price a room's drafts at a third of their cost. The wide widths are measured (one row of that many inputs,
    three rounds, no mask) and the table goes on to the widest through them, linearly between, never down."""
    limit = getattr(lm.model.config, "max_position_embeddings", None)
    if limit:  # a short-context model: a context it can hold with the passes and the AR steps after it
        context = max(1, min(context, limit // 2))
    widths = sorted({1, 2, 3, 4, max(2, max_width // 2 + 1), max_width})
    masks = (False, True) if lm.mask_token_id is not None else (False,)
    forward = time_widths(lm, backend, widths, context, rounds, masks)
    host = max(0.0, host_seconds(lm, backend, context) - forward[(1, False)])
    plain = {w: forward[(w, False)] + host for w in widths}
    by_width = fit_costs(plain, max_width)
    wide = sorted(w for w in wide if w > max_width and (not limit or context + w < limit))
    if wide:
        far = time_widths(lm, backend, wide, context, max(1, min(rounds, 3)), (False,))
        knots = [(max_width, by_width[-1])]
        for w in wide:
            knots.append((w, max(knots[-1][1], (far[(w, False)] + host) / plain[1])))
        more = []
        for (w0, c0), (w1, c1) in zip(knots, knots[1:]):
            more += [c0 + (c1 - c0) * (w - w0) / (w1 - w0) for w in range(w0 + 1, w1 + 1)]
        by_width = by_width + tuple(more)
    extra = [forward[(w, True)] - forward[(w, False)] for w in widths if (w, True) in forward]
    base = plain[1] if plain[1] > 0 else 1.0
    group = max(0.0, statistics.median(extra) / base) if extra else 0.0
    return PassCosts(by_width, group)


# ----------------------------------------------------------------------------- when the table is measured again
@dataclass(frozen=True)
class DriftRule:
    """When a pass-cost table is measured again: its predictions checked against the passes visitors' runs
    really took, and its age. A table measured at start-up describes that minute's machine: a neighbour's load
    that comes or goes, a thermal or frequency change, another oneDNN route after an update, and the tree's cut
    follows a wrong table for the process's life (benchmarks/cost_drift.py prints how the slope moves)."""

    tolerance: float = 0.25  # re-measure when a width's measured cost ratio is this far off the table's (relative)
    min_passes: int = 16  # ... judged on widths with at least this many recent passes, 1-input passes included
    window: int = 400  # the recent passes kept (the race's AR passes give the 1-input base)
    min_interval_s: float = 120.0  # never two measurements closer than this (each is ~0.8 s of the model thread)
    max_age_s: float = 1800.0  # re-measure a table this old even when nothing drifted
    # ... and sooner, this old, a table no wider pass has checked while 1-input passes ran: one measured on a busy
    # minute can price every draft out, and then only 1-input passes run, which can never show it wrong
    unchecked_age_s: float = 300.0
    idle_s: float = 2.0  # and only once no pass has run for this long: a visitor never waits behind it
    # A warm-up's table that reads flat (an input more costs under `flat_below` of a one-input pass) is measured
    # again once, `flat_recheck_s` after, before min_interval_s: a load on the cores while it ran (other processes,
    # a browser drawing the page on the same cores) falls hardest on host_seconds' decoder steps, many small torch
    # ops that are timed apart from the width rounds, and that one inflated denominator flattens the whole table
    # and the group cost with it (two AVX2 cores, other processes' tests running: host_seconds' AR step read
    # 350 ms against 6.9 ms in a quieter minute, the table +0.3% an input and +0.1% a mask group against +16%
    # and +15%, in one process, the app started as `launch` does). Nothing of the app's own overlaps
    # it: the datastore and the rehearsal run before and after on the loader thread, and Gradio's launch on the
    # main thread used 0.2-0.8 CPU-s of the 5-19 s the start-up measurement took; the load comes from outside.
    # A machine where inputs really are free (AMX) pays one more ~1 s measurement, once.
    flat_below: float = 0.05
    flat_recheck_s: float = 30.0

    def __post_init__(self):
        if not (self.tolerance > 0 and self.min_passes >= 1 and self.window >= self.min_passes
                and self.min_interval_s >= 0 and self.max_age_s > 0 and self.unchecked_age_s > 0
                and self.idle_s >= 0 and self.flat_below >= 0 and self.flat_recheck_s >= 0):
            raise ValueError(f"bad drift rule {self}: tolerance > 0, 1 <= min_passes <= window, times >= 0")


def observed_ratios(passes, max_width: int, min_passes: int) -> dict[tuple[int, bool], float]:
    """(width, with masks) -> the median seconds of such passes over the median of plain 1-input passes, from
    `passes`: (input width, mask inputs, seconds) of a run's passes; only widths the table covers and shapes
    with at least `min_passes` passes. Empty without enough 1-input passes to divide by."""
    by_shape: dict[tuple[int, bool], list[float]] = {}
    for width, masks, seconds in passes:
        if 1 <= width <= max_width:  # a prompt's pass (its whole length) is no decoding step
            by_shape.setdefault((width, masks > 0), []).append(seconds)
    base = by_shape.get((1, False), [])
    if len(base) < min_passes or statistics.median(base) <= 0:
        return {}
    b = statistics.median(base)
    return {shape: statistics.median(s) / b for shape, s in by_shape.items()
            if shape != (1, False) and len(s) >= min_passes}


def cost_drift(table: PassCosts, passes, min_passes: int = DriftRule.min_passes) -> float | None:
    """How far the table is off the passes really run: the largest |measured / predicted - 1| over the shapes
    with enough passes (predicted: by_width[w - 1], plus `group` where the pass had masks); None when the passes
    say nothing yet (no 1-input base, or no wider shape with enough passes)."""
    ratios = observed_ratios(passes, min(len(table.by_width), DRIFT_WIDTHS), min_passes)
    if not ratios:
        return None
    return max(abs(r / (table.by_width[w - 1] + (table.group if masked else 0.0)) - 1)
               for (w, masked), r in ratios.items())


def remeasure_reason(table: PassCosts | None, passes, measured_at: float, last_pass_at: float, now: float,
                     rule: DriftRule = DriftRule(), first: bool = False) -> str | None:
    """Why the table should be measured again now, or None: never within `idle_s` of the last pass; a warm-up's
    table (`first`) that reads flat once `flat_recheck_s` old; else never within `min_interval_s` of the last
    measurement; then when it is older than `max_age_s`, or the passes run since it was measured drifted past
    `tolerance`, or, older than `unchecked_age_s`, none of them could check it: at least `min_passes` 1-input
    passes and no wider shape with enough passes (a table that cuts every tree to nothing keeps every pass 1 wide)."""
    if table is None or now - last_pass_at < rule.idle_s:
        return None
    step = table.by_width[1] - 1 if len(table.by_width) > 1 else None
    if first and step is not None and step < rule.flat_below and now - measured_at >= rule.flat_recheck_s:
        return f"the warm-up's table read flat (an input more +{100 * step:.0f}%; a load on the cores can hide the cost)"
    if now - measured_at < rule.min_interval_s:
        return None
    if now - measured_at >= rule.max_age_s:
        return f"the table is {now - measured_at:.0f} s old"
    drift = cost_drift(table, passes, rule.min_passes)
    if drift is not None and drift > rule.tolerance:
        return f"the passes run differ from the table by {100 * drift:.0f}% (more than {100 * rule.tolerance:.0f}%)"
    if drift is None and now - measured_at >= rule.unchecked_age_s \
            and sum(1 for w, m, _ in passes if w == 1 and m == 0) >= rule.min_passes:
        return (f"only 1-input passes ran in the table's {now - measured_at:.0f} s: no wider pass checked it "
                "(a table that prices every draft out is never shown wrong)")
    return None
