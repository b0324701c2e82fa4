"""Warm before the first visitor (issue 41): the start-up rehearsal of the first Generate, and the pass-cost
table measured again when it drifts or ages (mars.decoding.costs.remeasure_reason, mars.app.cost_keeper)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from tiny import make_loaded
from mars.app import serving
from mars.app.cost_keeper import CostKeeper, pass_shape
from mars.decoding.costs import DriftRule, PassCosts, cost_drift, observed_ratios, remeasure_reason

TABLE = PassCosts((1.0, 1.2, 1.4, 1.6), 0.1)


def passes(shape_seconds: dict, n: int = 20):
    """n passes of each (width, masks) -> seconds."""
    return [(w, m, s) for (w, m), s in shape_seconds.items() for _ in range(n)]


# --------------------------------------------------------------------------------------------- the rule
def test_observed_ratios_divide_each_shape_by_the_one_input_pass():
    ps = passes({(1, 0): 0.004, (3, 0): 0.006, (3, 1): 0.0064, (40, 0): 0.3}) + [(2, 0, 0.1)] * 3
    r = observed_ratios(ps, max_width=4, min_passes=16)
    assert r == pytest.approx({(3, False): 1.5, (3, True): 1.6})  # a prompt's pass and a rare width left out
    assert observed_ratios(passes({(3, 0): 0.006}), 4, 16) == {}  # no 1-input base
    assert observed_ratios(passes({(1, 0): 0.004, (3, 0): 0.006}, n=5), 4, 16) == {}


def test_cost_drift_is_the_worst_shape_against_the_table():
    # the table says width 3 costs 1.4, with masks 1.5: measured 1.4 and 1.5 -> no drift
    assert cost_drift(TABLE, passes({(1, 0): 0.01, (3, 0): 0.014, (3, 1): 0.015})) == pytest.approx(0.0)
    # width 3 now costs 2.1 (a pass of three inputs got dearer): 50% off
    assert cost_drift(TABLE, passes({(1, 0): 0.01, (3, 0): 0.021, (2, 0): 0.012})) == pytest.approx(0.5)
    # cheaper than the table counts too
    assert cost_drift(TABLE, passes({(1, 0): 0.01, (4, 0): 0.008})) == pytest.approx(0.5)
    assert cost_drift(TABLE, passes({(1, 0): 0.01})) is None  # nothing wider run yet


def test_remeasure_reason_waits_for_its_interval_and_for_idle_then_on_drift_or_age():
    rule = DriftRule(tolerance=0.25, min_passes=16, min_interval_s=100, max_age_s=1000, idle_s=2)
    drifted = passes({(1, 0): 0.01, (3, 0): 0.021})
    steady = passes({(1, 0): 0.01, (3, 0): 0.0145})
    assert remeasure_reason(TABLE, drifted, measured_at=0, last_pass_at=0, now=50, rule=rule) is None  # too soon
    assert remeasure_reason(TABLE, drifted, measured_at=0, last_pass_at=199, now=200, rule=rule) is None  # busy
    why = remeasure_reason(TABLE, drifted, measured_at=0, last_pass_at=190, now=200, rule=rule)
    assert why is not None and "50%" in why
    assert remeasure_reason(TABLE, steady, measured_at=0, last_pass_at=190, now=200, rule=rule) is None
    assert "old" in remeasure_reason(TABLE, steady, measured_at=0, last_pass_at=190, now=1000, rule=rule)
    assert remeasure_reason(None, drifted, 0, 0, 2000, rule) is None  # no table: nothing to keep
    with pytest.raises(ValueError, match="drift rule"):
        DriftRule(tolerance=0)


def test_a_table_only_1_input_passes_ran_under_is_measured_again_sooner():
    """A table measured on a busy minute can price every draft out: then every pass is 1 wide and no drift can
    show. It is measured again after unchecked_age_s, not after max_age_s; a table wider passes checked is not."""
    rule = DriftRule(tolerance=0.25, min_passes=16, min_interval_s=100, max_age_s=1000, unchecked_age_s=300,
                     idle_s=2)
    only_ar = passes({(1, 0): 0.01})
    assert remeasure_reason(TABLE, only_ar, measured_at=0, last_pass_at=190, now=200, rule=rule) is None  # too young
    why = remeasure_reason(TABLE, only_ar, measured_at=0, last_pass_at=290, now=300, rule=rule)
    assert why is not None and "only 1-input passes" in why
    assert remeasure_reason(TABLE, only_ar, measured_at=0, last_pass_at=299, now=300, rule=rule) is None  # busy
    checked = passes({(1, 0): 0.01, (3, 0): 0.0145})
    assert remeasure_reason(TABLE, checked, measured_at=0, last_pass_at=290, now=300, rule=rule) is None
    assert remeasure_reason(TABLE, [], measured_at=0, last_pass_at=290, now=300, rule=rule) is None  # nobody came
    assert remeasure_reason(TABLE, passes({(1, 0): 0.01}, n=5), 0, 290, 300, rule) is None  # too few to say
    with pytest.raises(ValueError, match="drift rule"):
        DriftRule(unchecked_age_s=0)


# ------------------------------------------------------------------------------------------- the keeper
class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class Slot:
    """Runs the measurement here, and counts them."""

    def __init__(self):
        self.calls = 0

    def run(self, fn, *args):
        self.calls += 1
        return fn(*args)


def rec(width, drafts, seconds):
    return SimpleNamespace(input_len=width, drafts_sent=drafts, seconds=seconds)


def test_pass_shape_counts_the_mask_inputs():
    assert pass_shape(rec(1, 0, 0)) == (1, 0)  # AR
    assert pass_shape(rec(5, 3, 0)) == (5, 1)  # verified: last token, 3 drafts, one mask group
    assert pass_shape(rec(5, 4, 0)) == (5, 0)  # a tree without its group
    assert pass_shape(rec(5, 0, 0)) == (5, 4)  # MARS: the last token and a block of 4 masks


def test_the_keeper_measures_again_when_the_passes_drift_and_not_before():
    clock, slot = Clock(), Slot()
    new = PassCosts((1.0, 1.5, 2.0, 2.5), 0.1)
    keeper = CostKeeper(slot, DriftRule(min_passes=16, min_interval_s=100, max_age_s=10_000, idle_s=2), clock,
                        measure=lambda lm, backend: new)
    lm = SimpleNamespace(pass_costs={"fast-int8": TABLE})
    keeper.measured("fast-int8")
    for _ in range(20):  # the race: AR passes and 3-input tree passes, the tree's now 2.1x an AR pass
        keeper.observe("fast-int8", rec(1, 0, 0.010))
        keeper.observe("fast-int8", rec(3, 2, 0.021))
        keeper.observe("other", rec(3, 2, 0.5))  # a backend without a table here: not counted
    clock.t = 50
    assert keeper.tick(lm) == [] and slot.calls == 0  # within the interval
    clock.t = 200
    keeper.last_pass_at = 199.5
    assert keeper.tick(lm) == [] and slot.calls == 0  # a visitor is running
    clock.t = 205
    assert keeper.tick(lm) == ["fast-int8"] and slot.calls == 1
    assert lm.pass_costs["fast-int8"] is new and keeper.passes("fast-int8") == []
    assert keeper.history[-1]["backend"] == "fast-int8" and "differ" in keeper.history[-1]["reason"]
    clock.t = 1000
    assert keeper.tick(lm) == []  # the new table, no passes yet: nothing to measure


def test_the_keeper_measures_again_a_table_that_priced_every_draft_out():
    """Measured on a busy minute, the table made every input dear; the runs since sent no drafts, so every pass was
    1 wide. The keeper measures it again once unchecked_age_s has passed, not at max_age_s."""
    clock, slot = Clock(), Slot()
    steep, calm = PassCosts((1.0, 4.0, 7.0, 10.0), 2.0), PassCosts((1.0, 1.1, 1.2, 1.3), 0.05)
    keeper = CostKeeper(slot, DriftRule(min_passes=16, min_interval_s=100, max_age_s=1800, unchecked_age_s=300,
                                        idle_s=2), clock, measure=lambda lm, backend: calm)
    lm = SimpleNamespace(pass_costs={"fast-int8": steep})
    keeper.measured("fast-int8")
    for _ in range(40):
        keeper.observe("fast-int8", rec(1, 0, 0.006))
    clock.t = 200
    assert keeper.tick(lm) == [] and slot.calls == 0
    clock.t = 310
    assert keeper.tick(lm) == ["fast-int8"] and lm.pass_costs["fast-int8"] is calm
    assert "only 1-input passes" in keeper.history[-1]["reason"]


def test_a_flat_warm_up_table_is_measured_again_once_soon_and_the_panel_says_when():
    """The browser review: a start-up table read "+0% an input, mask inputs +1%" where the machine's is +11-17%
    (a load on the cores while it was measured: DriftRule.flat_below). The keeper measures such a warm-up table
    again once, flat_recheck_s after (when idle), long before min_interval_s; a table that is not flat, or the
    re-measured one even if flat again (a machine where inputs are free), waits for the usual rule. `when` says
    which table the panel shows: the warm-up's, or re-measured at what time and why."""
    clock, slot, wall = Clock(), Slot(), Clock()
    flat, real = PassCosts((1.0, 1.003, 1.006, 1.009), 0.001), PassCosts((1.0, 1.16, 1.32, 1.48), 0.1)
    rule = DriftRule(min_interval_s=120, max_age_s=1800, unchecked_age_s=300, idle_s=2, flat_recheck_s=30)
    keeper = CostKeeper(slot, rule, clock, measure=lambda lm, backend: flat, wall=wall)
    wall.t = 14 * 3600 + 2 * 60  # 14:02 UTC
    lm = SimpleNamespace(pass_costs={"fast-int8": flat})
    keeper.measured("fast-int8")  # the warm-up's
    assert keeper.when("fast-int8") == "measured when the model was loaded, 14:02 UTC (0 min ago)"
    clock.t, keeper.last_pass_at = 29, 0  # the rehearsal's passes ran at 0
    assert keeper.tick(lm) == [] and slot.calls == 0  # not before flat_recheck_s
    clock.t, keeper.last_pass_at = 31, 30  # a visitor's pass a second ago
    assert keeper.tick(lm) == [] and slot.calls == 0
    clock.t = 33
    wall.t += 60 * 20  # 14:22 UTC
    assert keeper.tick(lm) == ["fast-int8"] and slot.calls == 1  # measured again, flat again
    assert "read flat (an input more +0%;" in keeper.history[-1]["reason"]
    when = keeper.when("fast-int8")
    assert when.startswith("re-measured at 14:22 UTC (0 min ago), because the warm-up's table read flat")
    wall.t += 60 * 3
    assert "re-measured at 14:22 UTC (3 min ago)" in keeper.when("fast-int8")
    clock.t = 100
    assert keeper.tick(lm) == [] and slot.calls == 1  # once only: this flat table is the machine's
    steady = CostKeeper(Slot(), rule, clock, measure=lambda lm, backend: flat)
    clock.t = 0
    steady.measured("fast-int8")
    clock.t = 60
    assert steady.tick(SimpleNamespace(pass_costs={"fast-int8": real})) == []  # not flat: the usual rule
    assert remeasure_reason(flat, [], 0, -10, 60, rule) is None  # a table the keeper measured: not its warm-up's
    assert "read flat" in remeasure_reason(flat, [], 0, -10, 60, rule, first=True)


def test_a_failed_measurement_keeps_the_old_table_and_waits_its_interval():
    clock, slot = Clock(), Slot()

    def broken(lm, backend):
        raise RuntimeError("no timer")

    keeper = CostKeeper(slot, DriftRule(min_interval_s=100, max_age_s=150, idle_s=0), clock, measure=broken)
    lm = SimpleNamespace(pass_costs={"fast": TABLE})
    keeper.measured("fast")
    clock.t = 200
    assert keeper.tick(lm) == [] and slot.calls == 1 and lm.pass_costs["fast"] is TABLE
    clock.t = 250
    assert keeper.tick(lm) == [] and slot.calls == 1  # not again within the interval


def test_the_holder_feeds_its_passes_to_the_keeper_and_restarts_it_at_warm_up(tiny_lm, monkeypatch):
    from mars.app import inputs
    from mars.decoding.decoder import DecodeConfig, DecodeControl, encode_prompt

    lm = make_loaded()
    monkeypatch.setattr(inputs, "app_tree_nodes", lambda: 4)  # as on a CPU: the warm-up measures a table
    monkeypatch.setattr("mars.decoding.costs.measure_pass_costs", lambda lm, backend: TABLE)
    holder = serving.ModelHolder(lambda: lm, threads=1)
    holder.get()
    backend = next(iter(lm.pass_costs))
    assert lm.pass_costs[backend] is TABLE and backend in holder.costs.measured_at
    cfg = DecodeConfig(mode="verified", tau=0.0, block_size=2, max_new_tokens=6, backend=backend)
    got = list(holder.passes(lm, encode_prompt(lm.tokenizer, "hello there"), cfg, DecodeControl()))
    seen = holder.costs.passes(backend)
    assert [s[0] for s in seen] == [r.input_len for r in got] and [s[2] for s in seen] == [r.seconds for r in got]


# ----------------------------------------------------------------------------------- the start-up rehearsal
def _app(lm):
    import app

    return app.create_demo(lambda: lm).mars_app


def test_the_start_up_rehearses_the_first_generate_before_the_page_says_ready(monkeypatch):
    lm = make_loaded()
    ma = _app(lm)
    holder = ma.holder
    runs, real = [], holder.passes
    gate, entered = threading.Event(), threading.Event()

    def passes(lm_, ids, cfg, control):
        if holder.loaded is not None:  # past the load's own warm-up (ModelHolder.warm_up): the rehearsal
            runs.append((cfg.mode, cfg.tree_nodes, cfg.max_new_tokens))
            entered.set()
            gate.wait(30)
        yield from real(lm_, ids, cfg, control)

    holder.passes = passes
    holder.start()
    assert entered.wait(60)  # loaded and warmed up: now the rehearsal's run
    assert holder.state == "loading" and holder.loaded is lm  # the page still says loading
    asked = []
    visitor = threading.Thread(target=lambda: asked.append(holder.get()))
    visitor.start()
    time.sleep(0.2)
    assert not asked  # a visitor's Generate waits for the rehearsal
    gate.set()
    visitor.join(60)
    assert asked == [lm] and holder.state == "ready"
    # the page's defaults: verified with its tree, the page's max new tokens, and the AR race beside it
    assert runs == [("verified", ma.ui.tree_nodes.value, ma.ui.max_new.value), ("ar", 0, ma.ui.max_new.value)]
    assert holder.start_up["rehearsal_s"] > 0 and "rehearsal_error" not in holder.start_up
    assert holder.start_up["load_s"] >= 0 and holder.start_up["warm_up_s"] > 0
    assert not lm.warnings


def test_a_failed_rehearsal_is_reported_and_the_app_serves_on():
    lm = make_loaded()
    ma = _app(lm)

    real = ma.holder.passes

    def broken(lm_, ids, cfg, control):
        if ma.holder.loaded is not None:  # the load's own short warm-up passed: the rehearsal fails
            raise RuntimeError("kernel exploded")
        yield from real(lm_, ids, cfg, control)

    ma.holder.passes = broken
    ma.holder.start()
    ma.holder._loader.join(60)
    assert ma.holder.state == "ready"
    assert "kernel exploded" in ma.holder.start_up["rehearsal_error"]
    assert any("warm-up run failed" in w and "kernel exploded" in w for w in lm.warnings)
    banner = ma.model_info()[0]
    assert "warm-up run failed" in banner  # the model panel says it
    ma.holder.passes = real
    from mars.app.session import Session

    session = Session()
    for _ in ma.generate("hello there", 0.0, 2, 8, "prob", True, "Verified (lossless)", session, 4):
        pass
    assert session.mars.tokens > 0 and session.ar.tokens > 0  # serving
    session.close()
