"""The cheap CPU dropout against the definition: drop rate, scaling, gradient, reproducibility."""

from __future__ import annotations

import pytest
import torch

from transformer_mt.model.dropout import Dropout, drop_mask


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_drop_rate_is_p_at_every_position_of_a_draw(p: float) -> None:
    torch.manual_seed(0)
    mask = drop_mask((1 << 22,), p, torch.device("cpu")).float()
    assert abs(mask.mean().item() - p) < 1e-3
    # each element uses one 16-bit quarter of a 64-bit draw: no quarter may be biased
    for quarter in range(4):
        assert abs(mask[quarter::4].mean().item() - p) < 2e-3


def test_masks_of_neighbouring_elements_are_independent() -> None:
    torch.manual_seed(1)
    mask = drop_mask((1 << 22,), 0.5, torch.device("cpu")).float()
    both = (mask[:-1] * mask[1:]).mean().item()
    assert abs(both - 0.25) < 2e-3


def test_kept_values_and_gradients_are_scaled_like_torch_dropout() -> None:
    torch.manual_seed(2)
    p = 0.25
    x = torch.randn(37, 11, requires_grad=True)  # 407 elements: not a multiple of 4
    y = Dropout(p)(x)
    y.backward(torch.ones_like(y))
    kept = y != 0
    assert 0 < kept.sum() < x.numel()
    assert torch.allclose(y[kept], x[kept] / (1 - p))
    expected_grad = kept.float() / (1 - p)
    assert torch.equal(x.grad, expected_grad)


def test_identity_when_evaluating_or_p_is_zero() -> None:
    x = torch.randn(8, 16)
    assert torch.equal(Dropout(0.3).eval()(x), x)
    assert torch.equal(Dropout(0.0)(x), x)


def test_same_seed_same_mask_and_inplace_matches() -> None:
    x = torch.randn(64, 64)
    torch.manual_seed(3)
    a = Dropout(0.1)(x)
    torch.manual_seed(3)
    b = Dropout(0.1, inplace=True)(x.clone())
    assert torch.equal(a, b)
    assert not torch.equal(a, Dropout(0.1)(x))  # the generator moved on
