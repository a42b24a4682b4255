"""LoftQ's top-r factors: the randomized SVD it uses on wide matrices keeps what the exact top-r part keeps, is the
same on every run, and leaves the caller's random stream alone."""

from __future__ import annotations

import torch

from gym.models.loftq import top_singular


def _kept(matrix: torch.Tensor, u: torch.Tensor, s: torch.Tensor, vh: torch.Tensor) -> float:
    """The share of the matrix's energy (squared Frobenius norm) its rank-r part removes."""
    return float(1 - (matrix - (u * s) @ vh).norm() ** 2 / matrix.norm() ** 2)


def test_the_randomized_factors_keep_what_the_exact_svd_keeps():
    generator = torch.Generator().manual_seed(1)
    # Rounding residual-like: noise (a flat spectrum, the sketch's worst case) plus a few strong directions.
    noise = torch.rand(576, 1536, generator=generator) - 0.5
    strong = torch.randn(576, 4, generator=generator) @ torch.randn(4, 1536, generator=generator)
    for matrix, has_strong in ((noise, False), (noise + 0.05 * strong, True), ((noise + 0.05 * strong).T, True)):
        u, s, vh = top_singular(matrix, 16)
        assert u.shape == (matrix.shape[0], 16) and s.shape == (16,) and vh.shape == (16, matrix.shape[1])
        exact = torch.linalg.svdvals(matrix)
        best = float((exact[:16] ** 2).sum() / (exact**2).sum())
        assert _kept(matrix, u, s, vh) >= 0.98 * best
        if has_strong:
            assert torch.allclose(s[:4], exact[:4], rtol=1e-4)  # the strong directions are found exactly


def test_small_matrices_take_the_exact_svd():
    matrix = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    u, s, vh = top_singular(matrix, 8)
    exact_u, exact_s, exact_vh = torch.linalg.svd(matrix, full_matrices=False)
    assert torch.equal(s, exact_s[:8]) and torch.equal(u, exact_u[:, :8]) and torch.equal(vh, exact_vh[:8])


def test_the_factors_are_repeatable_and_the_callers_random_stream_is_untouched():
    matrix = torch.randn(300, 700, generator=torch.Generator().manual_seed(2))
    torch.manual_seed(5)
    expected_next = torch.rand(3)
    torch.manual_seed(5)
    first = top_singular(matrix, 4)
    assert torch.equal(torch.rand(3), expected_next)
    second = top_singular(matrix, 4)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
