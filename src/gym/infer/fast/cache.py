"""What both decoders (CPU: cpu.FastDecoder, GPU: gpu.GpuDecoder) do with their per-slot KV cache:
`keys`/`values` hold one [slots, kv_heads, capacity, head_dim] tensor per layer, and `grow` (each
decoder's own: where and how the tensors live differs) makes room."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class SlotCache(ABC):
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    capacity: int

    def _install(self, index: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Layer `index`'s cache becomes the larger keys/values, which take over what it held so far."""
        if self.capacity:
            keys[:, :, :self.capacity] = self.keys[index]
            values[:, :, :self.capacity] = self.values[index]
            self.keys[index], self.values[index] = keys, values
        else:
            self.keys.append(keys)
            self.values.append(values)

    @abstractmethod
    def grow(self, length: int) -> None:
        """Make room for `length` positions per slot."""

    def move_slot(self, source: int, target: int, length: int) -> None:
        for keys, values in zip(self.keys, self.values):
            keys[target, :, :length] = keys[source, :, :length]
            values[target, :, :length] = values[source, :, :length]

    def read_block(self, slot: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Cached keys and values of positions [start, end) of a slot, every layer: [layers, kv, n, d] each."""
        return (torch.stack([k[slot, :, start:end] for k in self.keys]),
                torch.stack([v[slot, :, start:end] for v in self.values]))

    def write_block(self, slot: int, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        end = start + keys.shape[2]
        self.grow(end)
        for index in range(len(self.keys)):
            self.keys[index][slot, :, start:end] = keys[index]
            self.values[index][slot, :, start:end] = values[index]
