"""Pack tokenized examples into rows of at most `capacity` tokens.

Best-fit decreasing keeps rows full (little padding). Each packed row remembers its examples'
lengths; the collator turns them into a block-diagonal attention mask, because with sdpa/eager
attention restarting `position_ids` alone does not stop one example attending to the previous one.
"""

from __future__ import annotations

import bisect


def pack(examples: list[dict[str, list[int]]], capacity: int) -> list[dict[str, list[int]]]:
    order = sorted(range(len(examples)), key=lambda i: len(examples[i]["input_ids"]), reverse=True)
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (room left, bin index), sorted, for best fit by bisection
    for i in order:
        size = len(examples[i]["input_ids"])
        slot = bisect.bisect_left(free, (size, -1))
        if slot < len(free):
            room, b = free.pop(slot)
        else:
            room, b = capacity, len(bins)
            bins.append([])
        bins[b].append(i)
        if room - size > 0:
            bisect.insort(free, (room - size, b))
    packed = []
    for members in bins:
        members.sort()  # keep dataset order inside a row: deterministic and readable
        row: dict[str, list[int]] = {"input_ids": [], "labels": [], "position_ids": [], "seq_lens": []}
        for i in members:
            ids = examples[i]["input_ids"]
            row["input_ids"] += ids
            row["labels"] += examples[i]["labels"]
            row["position_ids"] += list(range(len(ids)))
            row["seq_lens"].append(len(ids))
        packed.append(row)
    return packed
