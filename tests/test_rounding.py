"""The int8 weights' error-feedback rounding (mars/runtime/rounding.py, GPTQ) against its obvious column-by-column
form, what it buys (a smaller output error than rounding to nearest where inputs are correlated; the same
integers where they are not), the calibration moments, and the on-disk cache (mars/runtime/int8_weights.py)."""

import pytest
import torch

from mars import settings
from mars.runtime import calibration, int8_weights
from mars.runtime.quant import WEIGHT_MAX, Int8Linear, quantize_weight
from mars.runtime.rounding import gptq_round, round_columns


def correlated(n_in: int, n: int = 400, seed: int = 0) -> torch.Tensor:
    """H = E[x^T x] of inputs with a few shared directions and an outlier channel, as a transformer's are."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g) @ torch.randn(4, n_in, generator=g) * 2 + torch.randn(n, n_in, generator=g)
    x[:, 3] *= 20
    return (x.T @ x / n).float()


def output_error(w, q, scale, h):
    d = (w - q.double() * scale.double()[:, None]).double()
    return float(torch.einsum("oi,ij,oj->", d, h.double(), d))


@pytest.mark.parametrize("shape,block", [((24, 40), 16), ((7, 33), 8), ((16, 20), 128)])
def test_blocked_rounding_equals_column_by_column(shape, block):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(shape, generator=g)
    h = correlated(shape[1])
    _, scale = quantize_weight(w)
    q = gptq_round(w, h, scale, WEIGHT_MAX, block=block)
    assert q.dtype == torch.int8 and q.shape == w.shape and int(q.short().abs().max()) <= WEIGHT_MAX
    assert torch.equal(q, round_columns(w, h, scale, WEIGHT_MAX))


def test_feedback_lowers_the_output_error_and_is_nearest_rounding_without_correlation():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(64, 96, generator=g)
    nearest, scale = quantize_weight(w)
    h = correlated(96)
    q = gptq_round(w, h, scale, WEIGHT_MAX)
    assert output_error(w, q, scale, h) < 0.5 * output_error(w, nearest, scale, h)
    # uncorrelated inputs (a diagonal H): nothing to feed back, so each weight goes to its nearest point
    diag = torch.diag(torch.rand(96, generator=g) + 0.5)
    assert torch.equal(gptq_round(w, diag, scale, WEIGHT_MAX), nearest)


def test_an_input_that_is_always_zero_is_rounded_plainly():
    w = torch.randn(8, 12)
    h = correlated(12)
    h[5, :] = 0
    h[:, 5] = 0
    _, scale = quantize_weight(w)
    q = gptq_round(w, h, scale, WEIGHT_MAX)
    assert torch.isfinite(q.float()).all() and int(q.short().abs().max()) <= WEIGHT_MAX
    assert torch.equal(q, round_columns(w, h, scale, WEIGHT_MAX))


def test_moments_are_the_mean_of_x_transpose_x_at_each_input(tiny_lm):
    model = tiny_lm.model
    ids = torch.tensor([[1, 5, 9, 3], [1, 7, 2, 2]])
    groups = int8_weights.groups(model)
    seen = {}
    hooks = [mods[0].register_forward_pre_hook(lambda m, a, name=name: seen.setdefault(name, a[0].detach().clone()))
             for name, mods in groups.items()]
    with torch.inference_mode():
        model(input_ids=ids, use_cache=False)
    for h in hooks:
        h.remove()
    moments = calibration.input_moments(model, groups, ids)
    assert set(moments) == set(groups)
    for name, x in seen.items():
        x = x.reshape(-1, x.shape[-1]).double()
        torch.testing.assert_close(moments[name].double(), x.T @ x / x.shape[0], rtol=1e-4, atol=1e-6)


def test_calibration_tokens_are_the_same_for_the_same_model(tiny_lm):
    a = calibration.sample_tokens(tiny_lm.model, rows=3, steps=5)
    assert a.shape == (3, 6) and torch.equal(a, calibration.sample_tokens(tiny_lm.model, rows=3, steps=5))


def test_rounded_weights_are_cached_on_disk_and_keyed_by_the_weights(tiny_lm, tmp_path, monkeypatch):
    monkeypatch.setenv("MARS_CACHE", str(tmp_path))
    settings.reload()
    model = tiny_lm.model
    first = int8_weights.rounded_weights(model)
    files = list((tmp_path / "int8").glob("*.pt"))
    assert len(files) == 1
    for name, mods in int8_weights.groups(model).items():
        w = torch.cat([m.weight.detach() for m in mods]).float()
        assert first[name].shape == w.shape and int(first[name].short().abs().max()) <= WEIGHT_MAX

    def fail(_model):
        raise AssertionError("computed again despite the cache")

    monkeypatch.setattr(int8_weights, "round_model", fail)
    again = int8_weights.rounded_weights(model)
    assert all(torch.equal(first[k], again[k]) for k in first)
    monkeypatch.undo()
    monkeypatch.setenv("MARS_CACHE", str(tmp_path))
    settings.reload()
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(1.5)
    try:
        int8_weights.rounded_weights(model)
        assert len(list((tmp_path / "int8").glob("*.pt"))) == 2  # other weights, another file
    finally:
        with torch.no_grad():
            model.model.layers[0].mlp.down_proj.weight.div_(1.5)


def test_int8_linear_takes_rounded_weights_and_refuses_bad_ones():
    m = torch.nn.Linear(16, 8, bias=False)
    q, _ = quantize_weight(m.weight.detach().float())
    assert torch.equal(Int8Linear([m], None, q).qweight, q)
    with pytest.raises(ValueError, match="int8"):
        Int8Linear([m], None, q[:4])
    with pytest.raises(ValueError, match="int8"):
        Int8Linear([m], None, torch.full((8, 16), WEIGHT_MAX + 1, dtype=torch.int8))
