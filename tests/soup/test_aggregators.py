"""Aggregators: the properties each method promises, streaming from disk, and one documented weakness."""

from __future__ import annotations

import math
import weakref

import pytest
import torch
from safetensors.torch import save_file

from gym.core.errors import ConfigError, DataError
from gym.soup import aggregators as agg
from gym.soup import sources
from gym.soup.aggregators import AggregationMethod, aggregate, gram_matrix
from gym.soup.sources import InMemorySource, SafetensorsSource

# Non-square, 1-D, 3-D and 0-D tensors: the prototype crashed on anything but square matrices.
SHAPES = {"attn.weight": (3, 5), "bias": (7,), "conv": (2, 3, 4), "scale": ()}
METHODS = list(AggregationMethod)


def random_deltas(n: int, seed: int = 0, offset: float = 0.0) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [{name: torch.randn(shape, generator=gen) + offset for name, shape in SHAPES.items()} for _ in range(n)]


def flat(delta: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([delta[name].reshape(-1) for name in sorted(SHAPES)]).double()


def stack(deltas: list[dict[str, torch.Tensor]]) -> torch.Tensor:
    return torch.stack([flat(d) for d in deltas])


def options(method: AggregationMethod, n: int) -> dict:
    return {"weights": [1.0 + i % 3 for i in range(n)]} if method is AggregationMethod.WEIGHTED_MEAN else {}


def test_gram_matrix_equals_dense_float64_product():
    deltas = random_deltas(9)
    del deltas[4]["conv"]  # a missing name counts as zeros
    dense = stack([{**d, "conv": d.get("conv", torch.zeros(2, 3, 4))} for d in deltas])
    expected = dense @ dense.T
    gram = gram_matrix(InMemorySource(deltas))
    assert gram.dtype == torch.float64 and torch.equal(gram, gram.T)
    size = expected.diagonal().sqrt()
    assert ((gram - expected).abs() / (size[:, None] * size[None, :])).max() < 2e-6


def test_gram_blocks_and_chunks_give_the_same_matrix(monkeypatch):
    deltas = random_deltas(10, seed=1)
    whole = gram_matrix(InMemorySource(deltas))
    monkeypatch.setattr(agg, "GRAM_BLOCK", 3)  # 4 row blocks, the last one short
    monkeypatch.setattr(agg, "GRAM_CHUNK", 4)  # several column chunks per tensor
    blocked = gram_matrix(InMemorySource(deltas))
    assert torch.equal(blocked, blocked.T)
    torch.testing.assert_close(blocked, whole, rtol=1e-6, atol=1e-5)


def test_float32_products_stay_within_a_few_ulps_of_float64():
    # The precision traded for speed: float32 products over GRAM_CHUNK columns, float64 accumulation.
    x = torch.randn(6, 3 * agg.GRAM_CHUNK + 5, generator=torch.Generator().manual_seed(2)) + 0.5
    gram = gram_matrix(InMemorySource([{"w": row} for row in x]))
    exact = x.double() @ x.double().T
    size = exact.diagonal().sqrt()
    assert ((gram - exact).abs() / (size[:, None] * size[None, :])).max() < 2e-6


@pytest.mark.parametrize("method", METHODS)
def test_permutation_invariance(method):
    deltas = random_deltas(9, seed=3)
    perm = [4, 0, 7, 2, 8, 1, 6, 3, 5]
    kwargs = options(method, 9)
    first = aggregate(InMemorySource(deltas), method, **kwargs)
    if "weights" in kwargs:
        kwargs = {"weights": [kwargs["weights"][p] for p in perm]}
    second = aggregate(InMemorySource([deltas[p] for p in perm]), method, **kwargs)
    for name in SHAPES:
        torch.testing.assert_close(second.delta[name], first.delta[name], rtol=1e-5, atol=1e-6)
    assert sorted(perm[i] for i in second.selected) == sorted(first.selected)
    torch.testing.assert_close(torch.tensor([second.weights[perm.index(i)] for i in range(9)]),
                               torch.tensor(first.weights), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("method", METHODS)
def test_all_equal_inputs_return_that_input(method):
    one = random_deltas(1, seed=4)[0]
    result = aggregate(InMemorySource([one] * 7), method, **options(method, 7))
    for name, value in one.items():
        assert result.delta[name].shape == value.shape
        torch.testing.assert_close(result.delta[name], value, rtol=1e-6, atol=1e-6)


def test_krum_returns_one_input_bit_for_bit():
    deltas = random_deltas(8, seed=5)
    result = aggregate(InMemorySource(deltas), "krum", num_byzantine=2)
    (chosen,) = result.selected
    assert all(torch.equal(result.delta[name], deltas[chosen][name]) for name in SHAPES)
    assert result.weights[chosen] == 1.0 and sum(result.weights) == 1.0
    scores = result.info["scores"]
    assert scores[chosen] == min(scores)


def test_krum_scores_sum_the_nearest_squared_distances():
    x = stack(random_deltas(7, seed=6))
    d2 = torch.cdist(x, x) ** 2
    f = 2
    expected = [sorted(d2[i, j].item() for j in range(7) if j != i)[:7 - f - 2] for i in range(7)]
    scores = agg.krum_scores(x @ x.T, f)
    torch.testing.assert_close(scores, torch.tensor([sum(e) for e in expected], dtype=torch.float64))


@pytest.mark.parametrize("method", ["krum", "multi_krum"])
def test_krum_family_selects_only_honest_inputs_against_far_attackers(method):
    n, f = 11, 4  # n = 2f + 3, the least Krum accepts
    deltas = random_deltas(n - f, seed=7) + random_deltas(f, seed=8, offset=50.0)
    # Krum's own choice: the norm screen would set these attackers aside before Krum saw them, and, nearly
    # parallel (the offset dominates), they would enter as one point.
    result = aggregate(InMemorySource(deltas), method, num_byzantine=f, screen_ratio=None, duplicate_cosine=None)
    assert result.selected and set(result.selected) <= set(range(n - f))
    assert all(result.weights[i] == 0 for i in range(n - f, n))


@pytest.mark.parametrize("method", ["krum", "multi_krum", "byzantine_robust"])
def test_krum_refuses_too_few_contributions(method):
    with pytest.raises(ConfigError, match="2f \\+ 3"):
        aggregate(InMemorySource(random_deltas(6)), method, num_byzantine=2)
    with pytest.raises(ConfigError, match="2f \\+ 3"):
        aggregate(InMemorySource(random_deltas(2)), method)


@pytest.mark.parametrize("method", ["median", "trimmed_mean"])
def test_coordinate_wise_aggregates_stay_within_honest_bounds(method):
    n, f = 11, 3
    honest = random_deltas(n - f, seed=9)
    gen = torch.Generator().manual_seed(10)
    attackers = [{name: 1e3 * torch.randn(shape, generator=gen).sign() for name, shape in SHAPES.items()}
                 for _ in range(f)]
    result = aggregate(InMemorySource(attackers + honest), method, num_byzantine=f)
    low, high = stack(honest).min(0).values, stack(honest).max(0).values
    out = flat(result.delta)
    assert bool(((out >= low - 1e-6) & (out <= high + 1e-6)).all())


def test_median_of_an_even_count_averages_the_two_middle_values():
    rows = [torch.tensor([0.0, 5.0]), torch.tensor([1.0, -1.0]), torch.tensor([2.0, 0.0]), torch.tensor([10.0, 1.0])]
    result = aggregate(InMemorySource([{"w": r} for r in rows]), "median")
    torch.testing.assert_close(result.delta["w"], torch.tensor([1.5, 0.5]))


def test_trimmed_mean_trims_what_it_says():
    x = torch.arange(10.0).reshape(10, 1) * torch.ones(10, 3)
    # The arithmetic alone: these rows are parallel (near-copies) and one is zero (the norm screen's), so both
    # gym.soup.screen steps are off here.
    plain = {"screen_ratio": None, "duplicate_cosine": None}
    result = aggregate(InMemorySource([{"w": row} for row in x]), "trimmed_mean", trim_percent=0.2, **plain)
    assert result.info["trimmed"] == 2
    torch.testing.assert_close(result.delta["w"], torch.full((3,), 4.5))  # mean of 2..7
    with pytest.raises(ConfigError, match="Trimming 5 at each end of 10 contributions leaves nothing"):
        aggregate(InMemorySource([{"w": row} for row in x]), "trimmed_mean", num_byzantine=5, **plain)


def test_weiszfeld_objective_never_increases_and_matches_tensor_space():
    deltas = random_deltas(12, seed=11) + random_deltas(3, seed=12, offset=8.0)
    result = aggregate(InMemorySource(deltas), "geometric_median", tol=0.0, max_iter=40)
    trace = result.info["objective_trace"]
    assert 3 < result.info["iterations"] <= 40  # with tol=0 it runs until a step stops improving
    assert all(b <= a * (1 + 1e-12) for a, b in zip(trace, trace[1:]))
    assert trace[-1] < trace[0] * 0.99  # it moved: the mean is not the geometric median here
    x, z = stack(deltas), flat(result.delta)
    distances = (x - z).norm(dim=1)
    # The Gram-space objective is the real one (weights 1/n), and the minimiser beats every input point.
    assert math.isclose(float(distances.mean()), trace[-1], rel_tol=1e-5)
    assert all(float(distances.mean()) <= float((x - x[i]).norm(dim=1).mean()) for i in range(len(x)))
    gradient = ((z - x) / distances[:, None]).mean(0)  # zero at the geometric median
    assert float(gradient.norm()) < 1e-4
    assert math.isclose(sum(result.weights), 1.0, rel_tol=1e-9) and min(result.weights) > 0


def test_weighted_mean_uses_the_weights_given():
    deltas = random_deltas(3, seed=13)
    result = aggregate(InMemorySource(deltas), "weighted_mean", weights=[1, 0, 3])
    expected = (flat(deltas[0]) + 3 * flat(deltas[2])) / 4
    torch.testing.assert_close(flat(result.delta), expected, rtol=1e-5, atol=1e-6)
    assert result.selected == [0, 2] and result.weights == [0.25, 0.0, 0.75]
    with pytest.raises(ConfigError, match=r"weighted_mean needs one weight per contribution \(3\), got none"):
        aggregate(InMemorySource(deltas), "weighted_mean")
    with pytest.raises(ConfigError, match=r"weights must be finite, non-negative .*\[1\.0, -1\.0, 1\.0\]"):
        aggregate(InMemorySource(deltas), "weighted_mean", weights=[1, -1, 1])


@pytest.mark.parametrize("method", ["mean", "median", "krum", "byzantine_robust"])
def test_weights_where_unused_are_refused_not_ignored(method):
    with pytest.raises(ConfigError, match="weights"):
        aggregate(InMemorySource(random_deltas(7)), method, weights=[1.0] * 7)


def test_unknown_method_and_mismatched_shapes_are_user_errors():
    with pytest.raises(ConfigError, match="krum"):
        aggregate(InMemorySource(random_deltas(3)), "fedavg")
    with pytest.raises(DataError, match="attn.weight"):
        InMemorySource([{"attn.weight": torch.zeros(3, 5)}, {"attn.weight": torch.zeros(5, 3)}])


def test_byzantine_robust_drops_far_attackers_and_keeps_honest_accuracy():
    honest = random_deltas(14, seed=14, offset=1.0)
    gen = torch.Generator().manual_seed(15)
    attackers = [{name: 100 * torch.randn(shape, generator=gen) for name, shape in SHAPES.items()} for _ in range(6)]
    result = aggregate(InMemorySource(honest + attackers), "byzantine_robust")
    assert set(result.selected) <= set(range(14)) and len(result.selected) >= 10
    target = stack(honest).mean(0)
    assert torch.nn.functional.cosine_similarity(flat(result.delta), target, dim=0) > 0.95
    clean = aggregate(InMemorySource(honest), "byzantine_robust")
    assert torch.nn.functional.cosine_similarity(flat(clean.delta), target, dim=0) > 0.99


def test_byzantine_robust_clips_what_it_keeps_to_the_median_norm():
    deltas = random_deltas(11, seed=20, offset=1.0)
    for i, delta in enumerate(deltas):  # norms spread over 1x..1.5x: all pass the filter, half get clipped
        for value in delta.values():
            value.mul_(1 + i / 20)
    result = aggregate(InMemorySource(deltas), "byzantine_robust")
    size = stack(deltas).norm(dim=1)
    kept = result.selected
    assert len(kept) == 11 and result.info["clipped"]
    assert result.info["clip_norm"] == pytest.approx(float(size.median()), rel=1e-5)
    for i in kept:  # each kept contribution enters at weight 1/len(kept), at norm <= the median norm
        assert result.weights[i] * len(kept) * float(size[i]) <= result.info["clip_norm"] * (1 + 1e-6)
    expected = sum(result.weights[i] * stack(deltas)[i] for i in kept)
    torch.testing.assert_close(flat(result.delta), expected, rtol=1e-5, atol=1e-5)


def test_alie_fools_krum_documented_limitation():
    """A known weakness, kept visible: "a little is enough" (Baruch et al., 2019). Colluders send the honest
    mean minus z standard deviations per coordinate; that point sits closer to everyone than honest
    contributions do to each other, so Krum picks an attacker and the attackers choose the aggregate. Exact
    copies now count once (gym.soup.screen), so each colluder adds a little noise of its own: still far
    tighter than the honest points, and no longer copies (pairwise cosine about 0.9987)."""
    n, f = 20, 6
    gen = torch.Generator().manual_seed(16)
    shared = torch.randn(2000, generator=gen)
    honest = shared + 2 * torch.randn(n - f, 2000, generator=gen)
    s = math.floor(n / 2 + 1) - f
    z = float(torch.special.ndtri(torch.tensor((n - s) / n)))
    attack = honest.mean(0) - z * honest.std(0)
    jitter = torch.randn(f, 2000, generator=gen)
    attackers = attack + 0.05 * float(attack.norm()) * jitter / jitter.norm(dim=1, keepdim=True)
    rows = torch.cat([honest, attackers])
    result = aggregate(InMemorySource([{"w": r} for r in rows]), "krum", num_byzantine=f)
    assert not result.groups  # no copies for the screen to merge
    assert result.selected[0] >= n - f  # an attacker was chosen
    assert torch.equal(result.delta["w"], rows[result.selected[0]])


def write_contributions(tmp_path, deltas) -> list:
    paths = []
    for i, delta in enumerate(deltas):
        path = tmp_path / f"c{i}.safetensors"
        save_file({k: v.contiguous() for k, v in delta.items()}, str(path))
        paths.append(path)
    return paths


def test_safetensors_source_matches_in_memory(tmp_path):
    deltas = random_deltas(9, seed=17)
    del deltas[2]["bias"]
    deltas[5] = {k: v.half() for k, v in deltas[5].items()}  # stored in float16, read back as float32
    disk, memory = SafetensorsSource(write_contributions(tmp_path, deltas)), InMemorySource(deltas)
    assert disk.names == memory.names == sorted(SHAPES) and len(disk) == 9
    assert all(disk.shape(name) == memory.shape(name) for name in SHAPES)
    for method in METHODS:
        a = aggregate(disk, method, **options(method, 9))
        b = aggregate(memory, method, **options(method, 9))
        assert a.selected == b.selected and all(torch.equal(a.delta[k], b.delta[k]) for k in SHAPES)


def test_safetensors_source_reads_only_the_name_asked(tmp_path, monkeypatch):
    deltas = random_deltas(5, seed=18)
    del deltas[3]["conv"]
    source = SafetensorsSource(write_contributions(tmp_path, deltas))
    reads: list[str] = []
    real_open = sources.safe_open

    class Recording:
        def __init__(self, *args, **kwargs):
            self.inner = real_open(*args, **kwargs)

        def __enter__(self):
            self.file = self.inner.__enter__()
            return self

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

        def get_tensor(self, name):
            reads.append(name)
            return self.file.get_tensor(name)

    monkeypatch.setattr(sources, "safe_open", Recording)
    stacked = source.stacked("conv")
    assert reads == ["conv"] * 4 and stacked.shape == (5, 2, 3, 4)
    assert torch.equal(stacked[3], torch.zeros(2, 3, 4))


class Counting:
    """A source that counts reads per name and how many stacks are alive at once."""

    def __init__(self, inner):
        self.inner, self.names = inner, inner.names
        self.live = self.most_live = 0
        self.reads: dict[str, int] = {}

    def __len__(self):
        return len(self.inner)

    def shape(self, name):
        return self.inner.shape(name)

    def _freed(self):
        self.live -= 1

    def stacked(self, name):
        x = self.inner.stacked(name)
        self.live += 1
        self.most_live = max(self.most_live, self.live)
        self.reads[name] = self.reads.get(name, 0) + 1
        weakref.finalize(x, self._freed)
        return x


@pytest.mark.parametrize("method", METHODS)
def test_streaming_holds_one_stack_at_a_time(tmp_path, method):
    source = Counting(SafetensorsSource(write_contributions(tmp_path, random_deltas(9, seed=19))))
    aggregate(source, method, **options(method, 9))
    assert source.most_live == 1
    # One pass for the Gram matrix (the norm screen's norms, the near-copies' cosines, whole-model geometry), one
    # for the combination; no more.
    assert source.reads == {name: 2 for name in SHAPES}
