"""The sampling kernels (csrc/sampling.cpp): softmax with a temperature per row against torch's, and nucleus picks
against gym.infer.sampling's numpy picks, on every instruction-set variant this CPU runs; then sample_rows through
them against sample_rows through torch and numpy."""

from __future__ import annotations

import math

import pytest
import torch

from gym.infer import sampling
from gym.infer.fast import kernels
from gym.infer.requests import Request, SamplingParams


def _rows(vocab: int = 5003) -> torch.Tensor:
    """Logits of peaked, ordinary and near-uniform rows (a vocabulary that is no multiple of 8: the scalar tails)."""
    generator = torch.Generator().manual_seed(5)
    return torch.cat([torch.randn(4, vocab, generator=generator) * scale for scale in (8.0, 3.0, 1.0, 0.05)])


def test_compiled_softmax_rows_equals_torch_and_each_row_alone(ops):
    logits = _rows()
    temperatures = [0.3, 0.7, 1.0, 1.7] * 4
    got = ops.softmax_rows(logits, temperatures)
    want = torch.softmax(logits.double() / torch.tensor(temperatures, dtype=torch.float64)[:, None], -1)
    torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=1e-9)
    for row in range(logits.shape[0]):  # batch invariance: bit for bit what the row gets alone
        assert torch.equal(ops.softmax_rows(logits[row:row + 1], temperatures[row:row + 1])[0], got[row])


def test_compiled_softmax_rows_zeroes_forbidden_tokens_and_keeps_nan_rows_nan(ops):
    logits = _rows()[:3].clone()
    logits[0, 10:900] = -math.inf  # what a grammar's mask leaves
    logits[1, 7] = math.nan
    logits[2] = -math.inf
    got = ops.softmax_rows(logits, [1.0, 1.0, 1.0])
    assert (got[0, 10:900] == 0).all()
    assert float(got[0].double().sum()) == pytest.approx(1.0, abs=1e-5)
    assert got[1].isnan().all() and got[2].isnan().all()  # as torch.softmax makes them
    assert torch.softmax(logits[2], -1).isnan().all()


def test_compiled_nucleus_pick_equals_the_numpy_pick(ops):
    logits = _rows()
    ties = torch.zeros(2, 5003)
    ties[:, :40] = 3.0  # 40 tokens of equal probability, then 200 more: ties ordered by token id
    ties[:, 40:240] = 2.0
    ties[1, 100:] = -math.inf
    logits = torch.cat([logits, ties])
    generator = torch.Generator().manual_seed(9)
    for temperature in (0.5, 1.0):
        probs = torch.softmax(logits / temperature, -1)
        for top_p in (0.05, 0.5, 0.9, 0.999):
            draws = [0.0, 0.999999] + torch.rand(probs.shape[0] - 2, generator=generator, dtype=torch.float64).tolist()
            got = ops.nucleus_pick(probs, [top_p] * len(draws), draws, sampling.NUCLEUS_CUT,
                                   sampling.MAX_CANDIDATES).tolist()
            want = [sampling._nucleus_pick(probs[i].numpy(), top_p, draws[i]) for i in range(len(draws))]
            assert got == [-1 if pick is None else pick for pick in want]
            assert -1 in got and any(pick >= 0 for pick in got)  # both outcomes are exercised


def test_compiled_nucleus_pick_leaves_nan_rows_and_wide_rows_to_the_full_path(ops):
    probs = torch.full((2, 6000), 1 / 6000)  # every token a candidate: more than MAX_CANDIDATES
    probs[1, 3] = math.nan
    picks = ops.nucleus_pick(probs, [0.9, 0.9], [0.5, 0.5], sampling.NUCLEUS_CUT, sampling.MAX_CANDIDATES)
    assert picks.tolist() == [-1, -1]


def test_sample_rows_through_the_kernels_equals_torch_and_numpy(ops, monkeypatch):
    logits = _rows()
    settings = [SamplingParams(do_sample=True, temperature=t, top_p=p, top_k=k, seed=i)
                for i, (t, p, k) in enumerate([(0.7, 0.9, 0), (1.0, 0.95, 0), (0.3, 1.0, 0), (1.2, 0.8, 40)] * 4)]

    def sample() -> list[int]:
        requests = [Request([1], params, sink=lambda event: None) for params in settings]
        return sampling.sample_rows(requests, logits.clone())

    compiled = sample()
    monkeypatch.setitem(kernels._state, "ok", False)  # what a machine without the kernels runs
    assert sample() == compiled
