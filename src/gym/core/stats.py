"""Small statistics shared by `gym eval --compare` and the safety gate: McNemar's test on paired right/wrong items.

Both compare two models on the same items, item by item: only the discordant items (right for one, wrong for the
other) carry information about which is better, and McNemar's test asks whether they split more unevenly than a
fair coin would split them.
"""

from __future__ import annotations

import math

# McNemar's test takes the exact binomial below this many discordant items, the chi-square above.
EXACT_BELOW = 25


def _binomial_two_sided(k: int, n: int) -> float:
    """McNemar's exact test: P(at most min(b, c) of the b + c discordant items go one way), two-sided."""
    if n == 0:
        return 1.0
    tail: float = sum(math.comb(n, i) for i in range(0, min(k, n - k) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def mcnemar(only_a: int, only_b: int) -> tuple[float, str]:
    """(p-value, test name) of McNemar's test on the items only A got right and those only B got right.

    statsmodels' `mcnemar(table, exact=True, correction=True)` leaves exact-or-not to the caller; we choose by the
    usual rule (the exact binomial when b + c < 25, as the chi-square approximation is poor below that; e.g.
    Wikipedia, "McNemar's test"). The exact sum has a term per item, each a big integer: on 60,000 paired items
    it ran for minutes (issue #39). Above it: the chi-square with one degree of freedom and Edwards' continuity
    correction, statsmodels' `exact=False, correction=True`, (|b - c| - 1)^2 / (b + c), except that we stop the
    corrected difference at 0, so that b = c gives p = 1 (statsmodels squares -1 there)."""
    n = only_a + only_b
    if n < EXACT_BELOW:
        return _binomial_two_sided(only_a, n), "McNemar exact"
    statistic = max(abs(only_a - only_b) - 1, 0) ** 2 / n
    return math.erfc(math.sqrt(statistic / 2)), "McNemar chi-square"  # P(chi2 with 1 df > statistic)


def mean_and_stderr(values: list[float]) -> tuple[float, float]:
    """The mean and its standard error (sample standard deviation / sqrt(n); NaN for one value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(variance / n)
