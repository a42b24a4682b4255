"""gym.infer.sampling against a plain reference: the full vocabulary sorted, top-k, top-p, inverse CDF."""

from __future__ import annotations

import torch

from gym.infer.requests import Request, SamplingParams
from gym.infer.sampling import _nucleus_pick, sample_rows


def _reference(logits: torch.Tensor, params: SamplingParams, draw: float) -> int:
    probs = torch.softmax(logits / params.temperature, -1)
    values, order = probs.sort(descending=True)
    values = values.double()
    if params.top_k > 0:
        values = values[: params.top_k] / values[: params.top_k].sum()
        order = order[: params.top_k]
    cumulative = values.cumsum(-1)
    values = values.masked_fill((cumulative - values) >= params.top_p, 0.0)
    cdf = values.cumsum(-1)
    return int(order[int((cdf < draw * cdf[-1]).sum().clamp(max=len(order) - 1))])


def test_filtered_sampling_equals_the_full_sort_reference():
    torch.manual_seed(0)
    vocab = 5000
    settings = [SamplingParams(do_sample=True, temperature=t, top_p=p, top_k=k)
                for t in (0.3, 0.7, 1.5) for p in (0.5, 0.9, 0.999) for k in (0, 20, 300)]
    # Peaked and flat rows: a flat row's nucleus is thousands of tokens wide, past the first candidate width.
    logits = torch.cat([torch.randn(len(settings) // 2, vocab) * 6, torch.randn(len(settings) - len(settings) // 2,
                                                                                 vocab) * 0.1])
    for seed in range(5):
        requests = [Request([1], SamplingParams(**{**vars(p), "seed": seed * 100 + i}), sink=lambda e: None)
                    for i, p in enumerate(settings)]
        draws = [float(torch.rand(1, generator=torch.Generator().manual_seed(seed * 100 + i)))
                 for i in range(len(settings))]
        got = sample_rows(requests, logits.clone())
        want = [_reference(logits[i], p, draws[i]) for i, p in enumerate(settings)]
        assert got == want


def test_plain_temperature_sampling_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2, 0.0]]).clamp(min=1e-12))
    counts = torch.zeros(4)
    for seed in range(3000):
        request = Request([1], SamplingParams(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, seed=seed),
                          sink=lambda e: None)
        counts[sample_rows([request], logits.clone())[0]] += 1
    assert counts[3] == 0
    assert torch.allclose(counts[:3] / counts.sum(), torch.tensor([0.5, 0.3, 0.2]), atol=0.03)


def test_greedy_rows_take_the_argmax_and_seeded_rows_ignore_their_neighbours():
    torch.manual_seed(1)
    logits = torch.randn(3, 1000)
    greedy = Request([1], SamplingParams(do_sample=False), sink=lambda e: None)
    seeded = SamplingParams(do_sample=True, temperature=1.0, top_p=0.9, top_k=0, seed=7)
    alone = sample_rows([Request([1], seeded, sink=lambda e: None)], logits[1:2].clone())[0]
    mixed = sample_rows([greedy, Request([1], seeded, sink=lambda e: None),
                         Request([1], SamplingParams(do_sample=True, top_k=5, seed=3), sink=lambda e: None)],
                        logits.clone())
    assert mixed[0] == int(logits[0].argmax())
    assert mixed[1] == alone


def test_the_candidate_shortcut_serves_peaked_rows_and_leaves_flat_ones_to_topk():
    """A trained model's peaked row is sampled from its likely tokens alone; a near-uniform row, whose
    likely tokens are most of the vocabulary, goes the batched topk way. Both give the reference's pick."""
    torch.manual_seed(2)
    peaked, flat = torch.randn(20000) * 6, torch.randn(20000) * 0.01
    params = SamplingParams(do_sample=True, temperature=0.7, top_p=0.9, top_k=0)
    for logits in (peaked, flat):
        probs = torch.softmax(logits / params.temperature, -1)
        for draw in (0.0, 0.37, 0.999):
            pick = _nucleus_pick(probs.numpy(), params.top_p, draw)
            if logits is flat:
                assert pick is None
            else:
                assert pick == _reference(logits, params, draw)
