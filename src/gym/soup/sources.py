"""Where a soup's contributions come from, one tensor name at a time (the DeltaSource protocol).

Aggregators never hold a whole model per contribution: they ask a source for one parameter stacked over
the n contributions, so memory is O(n x largest tensor). Contributions live in memory (InMemorySource)
or on disk as plain safetensors files (SafetensorsSource, read with safe_open: nothing is unpickled);
ScaledSource (norm clipping), SubsetSource (a selection) and GroupedSource (near-copies as one, gym.soup.screen)
wrap another source without copying it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

import torch
from safetensors import safe_open

from gym.core.errors import DataError


class DeltaSource(Protocol):
    """n contributions, each a dict name -> tensor; a name a contribution lacks counts as zeros."""

    names: list[str]  # union of names over contributions, sorted

    def __len__(self) -> int: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def stacked(self, name: str) -> torch.Tensor:
        """float32 [n, *shape], zeros where a contribution lacks the name; the caller owns it (may edit it)."""
        ...


def _stack(n: int, shape: tuple[int, ...], rows: Iterable[tuple[int, torch.Tensor]]) -> torch.Tensor:
    """float32 [n, *shape] from (index, tensor) pairs; rows not given are zeros.

    Rows are copied through numpy, on one thread: torch's parallel copies of many rows stall on OpenMP
    barriers when the machine is busy (a 1 GiB stack took 6 s instead of 0.7 s at load 5 on 2 cores).
    """
    out = torch.empty((n, *shape), dtype=torch.float32)
    view, missing = out.numpy(), set(range(n))
    for i, row in rows:
        view[i] = row.detach().to("cpu", torch.float32).numpy()
        missing.discard(i)
    for i in missing:
        view[i] = 0
    return out


def _merge_shape(shapes: dict[str, tuple[int, ...]], name: str, shape: tuple[int, ...], where: str) -> None:
    if shapes.setdefault(name, shape) != shape:
        raise DataError(f"Tensor {name!r} has shape {list(shape)} in {where} but {list(shapes[name])} elsewhere; "
                        "every contribution must be a delta of the same base model.")


class InMemorySource:
    """A DeltaSource over deltas already in memory."""

    def __init__(self, deltas: list[dict[str, torch.Tensor]]) -> None:
        self._deltas = list(deltas)
        self._shapes: dict[str, tuple[int, ...]] = {}
        for i, delta in enumerate(self._deltas):
            for name, value in delta.items():
                _merge_shape(self._shapes, name, tuple(value.shape), f"contribution {i}")
        self.names = sorted(self._shapes)

    def __len__(self) -> int:
        return len(self._deltas)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def stacked(self, name: str) -> torch.Tensor:
        rows = ((i, delta[name]) for i, delta in enumerate(self._deltas) if name in delta)
        return _stack(len(self._deltas), self._shapes[name], rows)


class SafetensorsSource:
    """A DeltaSource over plain safetensors files (name -> tensor), read one name at a time.

    Files are reopened per read (safe_open maps the file and parses only its header), so a thousand
    contributions do not hold a thousand open descriptors.
    """

    def __init__(self, paths: Sequence[str | os.PathLike[str]]) -> None:
        self._paths = [str(p) for p in paths]
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._has: list[set[str]] = []
        for path in self._paths:
            if not os.path.isfile(path):
                raise DataError(f"Contribution file {path} does not exist.")
            with safe_open(path, framework="pt") as f:
                keys = set(f.keys())
                for name in keys:
                    _merge_shape(self._shapes, name, tuple(f.get_slice(name).get_shape()), path)
            self._has.append(keys)
        self.names = sorted(self._shapes)

    def __len__(self) -> int:
        return len(self._paths)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def stacked(self, name: str) -> torch.Tensor:
        return _stack(len(self._paths), self._shapes[name], self._read(name))

    def _read(self, name: str) -> Iterator[tuple[int, torch.Tensor]]:
        for i, (path, keys) in enumerate(zip(self._paths, self._has)):
            if name in keys:
                with safe_open(path, framework="pt") as f:
                    yield i, f.get_tensor(name)


class ScaledSource:
    """Contribution i multiplied by scales[i] (norm clipping), without touching the underlying data."""

    def __init__(self, source: DeltaSource, scales: Sequence[float]) -> None:
        if len(scales) != len(source):
            raise ValueError(f"{len(scales)} scales for {len(source)} contributions")
        self.source, self.names = source, source.names
        self.scales = torch.tensor([float(s) for s in scales], dtype=torch.float32)

    def __len__(self) -> int:
        return len(self.source)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.source.shape(name)

    def stacked(self, name: str) -> torch.Tensor:
        x = self.source.stacked(name)
        return x.mul_(self.scales.view(-1, *([1] * (x.dim() - 1))))


class SubsetSource:
    """The contributions at `indices` of another source (in that order)."""

    def __init__(self, source: DeltaSource, indices: Sequence[int]) -> None:
        self.source, self.names, self.indices = source, source.names, list(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.source.shape(name)

    def stacked(self, name: str) -> torch.Tensor:
        return self.source.stacked(name)[self.indices]


class GroupedSource:
    """One contribution per group of another source's contributions: the mean of the group's members.

    A group of one is that contribution as it is (a selection: SubsetSource's job, done here too).
    """

    def __init__(self, source: DeltaSource, groups: Sequence[Sequence[int]]) -> None:
        self.source, self.names, self.groups = source, source.names, [list(g) for g in groups]
        self._firsts = torch.tensor([g[0] for g in self.groups], dtype=torch.long)

    def __len__(self) -> int:
        return len(self.groups)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.source.shape(name)

    def stacked(self, name: str) -> torch.Tensor:
        x = self.source.stacked(name)
        out = x.index_select(0, self._firsts)  # one gather; groups of several are averaged over it below
        for row, members in enumerate(self.groups):
            if len(members) > 1:
                # Divided before summing: the members' sum can overflow float32 where their mean does not.
                out[row] = x[members].div_(len(members)).sum(dim=0)
        return out
