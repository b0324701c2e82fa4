"""Trees sized by what a wider pass costs here: the cut (tree.best_cut) against a brute-force search, the
measured costs (mars.decoding.costs), the decoder keeping AR's text with any cut, the app's wiring."""

from dataclasses import replace

import pytest

from mars.runtime.backends import resolve_backend
from mars.decoding.costs import PassCosts, fit_costs, measure_pass_costs
from mars.decoding.decoder import DecodeConfig, encode_prompt, generate_ids
from mars.decoding.tree import EXPLORE_EVERY, GAIN_PASSES, TreeMode, best_cut, grow_tree, pass_cost

PROMPTS = ["what is the capital of france ?", "write a long sentence about the water and the earth and the air"]


def rate(values, k, costs, width):
    return (1 + sum(values[:k])) / pass_cost(costs, width(k))


@pytest.mark.parametrize("slope, expected", [(0.0, 3), (0.05, 3), (0.25, 2), (0.5, 2), (2.0, 1), (10.0, 0)])
def test_best_cut_is_the_best_prefix_by_brute_force(slope, expected):
    costs = tuple(1 + slope * w for w in range(6))  # shorter than the widths asked for: extended by its last step
    width = lambda k: 2 + k  # noqa: E731 - the root, k nodes, one mask
    for values in ([0.9, 0.5, 0.3, 0.1, 0.05, 0.01, 0.01], [0.2, 0.2, 0.2], [0.99] * 9, []):
        k = best_cut(values, costs, width)
        best = max(rate(values, j, costs, width) for j in range(len(values) + 1))
        assert rate(values, k, costs, width) == pytest.approx(best)
    # worked by hand: at slope 0.25, (1 + .9 + .5) / 1.75 = 1.37 beats (1 + .9 + .5 + .3) / 2 = 1.35
    assert best_cut([0.9, 0.5, 0.3], costs, width) == expected


def test_pass_cost_extends_the_table_by_its_last_step_never_down():
    assert pass_cost((1.0, 1.5, 1.75), 2) == 1.5
    assert pass_cost((1.0, 1.5, 1.75), 5) == pytest.approx(2.25)
    assert pass_cost((1.0, 1.5, 1.25), 6) == 1.25
    assert pass_cost((1.0,), 9) == 1.0


def plain(costs):
    """A cut by `costs` for a pass of the root and k nodes, no mask group."""
    return lambda values: best_cut(values, costs, lambda k: 1 + k)


def test_grow_tree_with_costs_keeps_the_best_nodes_and_their_ancestors():
    dists = [([10, 11, 12], [0.6, 0.3, 0.1]), ([20, 21], [0.5, 0.4])]
    full = grow_tree(dists, [30, 31], budget=8, copy_share=(0.7, 0.2))
    assert grow_tree(dists, [30, 31], budget=8, copy_share=(0.7, 0.2), cut=plain((1.0,))).tokens == full.tokens
    for slope in (0.1, 0.3, 0.6, 3.0):
        costs = tuple(1 + slope * w for w in range(12))
        cut = grow_tree(dists, [30, 31], budget=8, copy_share=(0.7, 0.2), cut=plain(costs))
        # the kept nodes are the likeliest (ancestors first), as many as best_cut says for the uncut values
        assert len(cut) == best_cut(sorted(full.values, reverse=True), costs, lambda k: 1 + k)
        assert sorted(cut.values, reverse=True) == sorted(full.values, reverse=True)[:len(cut)]
        assert all(p < i for i, p in enumerate(cut.parents))  # depth first: every parent kept, before its child
    assert len(grow_tree(dists, [30, 31], budget=8, copy_share=(0.7, 0.2), cut=plain((1.0, 9.0)))) == 0


def test_fit_costs_is_a_line_through_the_medians():
    assert fit_costs({1: 4.0, 2: 5.0, 4: 7.0, 8: 11.0}, 5) == pytest.approx((1.0, 1.25, 1.5, 1.75, 2.0))
    assert fit_costs({1: 5.0, 2: 4.0, 3: 3.0}, 3) == (1.0, 1.0, 1.0)  # dearer when narrower: noise, so flat
    assert fit_costs({1: 4.0}, 3) == (1.0, 1.0, 1.0)
    noisy = fit_costs({1: 4.0, 2: 6.0, 3: 5.0, 4: 7.0}, 4)  # one slow width does not bend the table
    assert all(b > a for a, b in zip(noisy, noisy[1:]))


def test_pass_costs_are_checked_once_in_the_config():
    cfg = DecodeConfig(mode="verified", tree_nodes=4, pass_costs=[1, 1.5, 2])
    assert cfg.pass_costs == (1.0, 1.5, 2.0)
    for bad in ("1,2", [], [1, 0], [1, float("nan")], [1, "2"], 3):
        with pytest.raises(ValueError, match="pass costs must be a list of 1 to"):
            DecodeConfig(mode="verified", tree_nodes=4, pass_costs=bad)
    with pytest.raises(ValueError, match="pass costs need a tree"):
        DecodeConfig(mode="verified", pass_costs=[1, 2])
    assert DecodeConfig(mode="verified", tree_nodes=4, pass_costs=[1, 2], group_cost=0).group_cost == 0.0
    for bad in (-0.1, float("inf"), "0.2", True):
        with pytest.raises(ValueError, match="group cost must be a number of 0 or more"):
            DecodeConfig(mode="verified", tree_nodes=4, pass_costs=[1, 2], group_cost=bad)
    with pytest.raises(ValueError, match="group cost needs pass costs"):
        DecodeConfig(mode="verified", tree_nodes=4, group_cost=0.2)


def test_the_mask_group_goes_while_its_measured_worth_pays_for_it():
    costs = tuple(1 + 0.15 * w for w in range(12))
    values = [0.9, 0.6, 0.1]
    mode = TreeMode(4, "last", costs=costs, group_cost=0.12)
    assert mode._cut(values, 1, 1, 0)[1] is True  # worth not measured yet: the group goes
    mode.gain[0], mode.gain_n[0] = 0.1, GAIN_PASSES
    k, group = mode._cut(values, 1, 1, 0)
    # 0.1 tokens a pass do not pay for a mask input and its +0.12: it stays out, and k is the cut without it
    assert group is False and k == best_cut(values, costs, lambda j: 1 + j)
    mode.gain[0] = 2.0  # drafts that the masks alone find, two a pass: worth their inputs
    assert mode._cut(values, 1, 1, 0)[1] is True
    mode.gain[0] = 0.0  # worth nothing: out, but sent once in EXPLORE_EVERY passes so it stays measured
    sent = [mode._cut(values, 1, 1, 0)[1] for _ in range(2 * EXPLORE_EVERY)]
    assert sent.count(True) == 2 and sent[EXPLORE_EVERY - 1] and sent[2 * EXPLORE_EVERY - 1]
    free = TreeMode(4, "last", costs=(1.0,), group_cost=0.0)  # inputs and masks cost nothing: it always goes
    free.gain[0], free.gain_n[0] = 0.0, GAIN_PASSES
    assert free._cut(values, 1, 1, 0) == (3, True)
    assert TreeMode(4, "last", costs=costs)._cut(values, 1, 1, 0)[1] is True  # no group cost: never weighed
    # verify_groups "all" (n_groups None): a group of n masks on the root and on every node, all counted
    every = TreeMode(4, "all", costs=costs, group_cost=0.12)
    spread = [0.9, 0.3, 0.2]  # 1 node with the groups' 3 masks each, 2 without them
    assert every._cut(spread, 3, None, 0) == (1, True)
    every.gain[0], every.gain_n[0] = 0.1, GAIN_PASSES  # and weighed like one group once their worth is measured
    assert every._cut(spread, 3, None, 0) == (2, False)


@pytest.mark.parametrize("drafts", ["mars", "both"])
def test_a_cut_tree_keeps_ar_text_and_sends_what_the_costs_allow(tiny_lm, drafts):
    ids = [encode_prompt(tiny_lm.tokenizer, p) for p in PROMPTS]
    ar = [r.token_ids for r in generate_ids(tiny_lm, ids, DecodeConfig(mode="ar", tau=1.0, block_size=1,
                                                                             max_new_tokens=32))]
    base = DecodeConfig(mode="verified", tau=0.0, block_size=3, tree_nodes=8, drafts=drafts, verify_groups="last",
                        max_new_tokens=32)

    def runs(costs, group_cost=None):
        cfg = replace(base, pass_costs=costs, group_cost=group_cost)
        alone = [generate_ids(tiny_lm, [p], cfg)[0] for p in ids]
        assert [r.token_ids for r in alone] == ar  # whatever the cut, AR's text
        assert [r.token_ids for r in generate_ids(tiny_lm, ids, cfg)] == ar  # batched too
        return [s.drafts_sent for r in alone for s in r.steps]

    full = runs(None)
    assert runs(tuple(1 + 0.1 * w for w in range(16)), 5.0)  # mask groups dropped: still AR's text
    assert runs((1.0,)) == full  # costs that do not grow: every node pays, the same trees
    assert max(full) == 8
    middle = runs(tuple(1 + 0.15 * w for w in range(16)))
    assert max(middle) <= 8 and sum(middle) / len(middle) < sum(full) / len(full)
    # each input multiplies a pass's cost by 1000: no draft, however sure, pays for one
    assert set(runs(tuple(1000.0 ** w for w in range(16)))) == {0}


def test_measured_costs_start_at_one_and_never_fall(tiny_lm):
    measured = measure_pass_costs(tiny_lm, resolve_backend(tiny_lm.model, "auto"), max_width=6, rounds=2, wide=())
    costs = measured.by_width
    assert len(costs) == 6 and costs[0] == 1.0 and measured.group >= 0
    assert all(b >= a for a, b in zip(costs, costs[1:]))
    # a room's wide passes are measured, not extrapolated: the table goes on to the widest, never down
    wide = measure_pass_costs(tiny_lm, resolve_backend(tiny_lm.model, "auto"), max_width=6, rounds=2, wide=(16, 32))
    assert len(wide.by_width) == 32 and wide.by_width[:6] != () and all(
        b >= a for a, b in zip(wide.by_width, wide.by_width[1:]))
    DecodeConfig(mode="verified", tree_nodes=4, pass_costs=costs, group_cost=measured.group)  # usable as they come


def test_the_app_measures_costs_at_warm_up_and_its_trees_use_them(tiny_lm, monkeypatch, env):
    from mars.app import inputs
    from mars.app.inputs import app_pass_costs, fit_to_model, make_config

    monkeypatch.setattr(tiny_lm, "pass_costs", {})
    monkeypatch.setattr(inputs, "app_tree_nodes", lambda: 4)  # as on a CPU
    env.set("MARS_TREE_CUT", "0")
    assert app_pass_costs(tiny_lm, "fast") is None and tiny_lm.pass_costs == {}
    env.unset("MARS_TREE_CUT")
    calls = []
    measured = PassCosts((1.0, 1.3, 1.6), 0.2)
    monkeypatch.setattr("mars.decoding.costs.measure_pass_costs", lambda lm, b: calls.append(b) or measured)
    assert app_pass_costs(tiny_lm, "fast") == measured
    assert app_pass_costs(tiny_lm, "fast") == measured and calls == ["fast"]  # measured once
    cfg = make_config("verified", 0.0, 2, 16, tree_nodes=4, backend="fast")
    fitted = fit_to_model(tiny_lm, cfg)[0]
    assert fitted.pass_costs == (1.0, 1.3, 1.6) and fitted.group_cost == 0.2
    assert fit_to_model(tiny_lm, replace(cfg, tree_nodes=0))[0].pass_costs is None  # the chain: nothing to cut
    monkeypatch.setattr(inputs, "app_tree_nodes", lambda: 0)  # a GPU: no tree, nothing measured
    monkeypatch.setattr(tiny_lm, "pass_costs", {})
    assert app_pass_costs(tiny_lm, "fast") is None


def test_tree_cut_0_sends_whole_trees_even_with_a_table_on_the_model(tiny_lm, monkeypatch, env):
    """MARS_TREE_CUT=0 holds where each run's config is fitted, not only where the table is measured: a table
    already on the model (measured while the setting was on; here a loaded machine's, where no draft pays) cuts
    no tree, and the run sends its N nodes every pass, as with no table at all."""
    from mars.app.inputs import fit_to_model, make_config

    loaded = PassCosts(tuple(1.0 + 3.0 * w for w in range(8)), 0.01)  # each input +300%: no draft pays for itself
    monkeypatch.setattr(tiny_lm, "pass_costs", {"fast": loaded})
    cfg = make_config("verified", 0.0, 2, 16, tree_nodes=4, backend="fast")
    ids = encode_prompt(tiny_lm.tokenizer, PROMPTS[0])

    def sent(config):
        return [s.drafts_sent for s in generate_ids(tiny_lm, [ids], config)[0].steps[1:]]  # pass 0: no drafts yet

    cut = fit_to_model(tiny_lm, cfg)[0]
    assert cut.pass_costs == loaded.by_width and cut.group_cost == loaded.group
    assert set(sent(cut)) == {0}  # the cut is live: this table sends no draft

    env.set("MARS_TREE_CUT", "0")
    whole = fit_to_model(tiny_lm, cfg)[0]
    assert whole.pass_costs is None and whole.group_cost is None
    assert tiny_lm.pass_costs == {"fast": loaded}  # the table stays: the setting, not the table, decides
    assert sent(whole) == sent(cfg) and max(sent(whole)) == 4  # the same trees as with no table: N nodes a pass


def test_a_failed_measurement_leaves_trees_whole_and_the_app_serving(tiny_lm, monkeypatch):
    from mars.app import inputs

    monkeypatch.setattr(tiny_lm, "pass_costs", {})
    monkeypatch.setattr(inputs, "app_tree_nodes", lambda: 4)

    def broken(lm, backend):
        raise RuntimeError("no timer")

    monkeypatch.setattr("mars.decoding.costs.measure_pass_costs", broken)
    assert inputs.app_pass_costs(tiny_lm, "fast") is None and tiny_lm.pass_costs == {}
