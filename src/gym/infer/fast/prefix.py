"""Prefix caching: the KV of prompt blocks already computed, reused by later prompts that start the same.

Chat requests to one model mostly begin with the same system prompt and template header; computing
their keys and values once saves that part of every later prefill. Prompts are cut into blocks of
BLOCK tokens; a block's entry is keyed by every token up to its end (so a hit means the whole prefix
is equal, not just the block) and holds the block's keys and values for every layer. Entries are kept
least-recently-used first within a byte budget.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from gym.infer.fast.cpu import FastDecoder
from gym.infer.fast.gpu import GpuDecoder

BLOCK = 64


class PrefixCache:
    def __init__(self, decoder: FastDecoder | GpuDecoder, budget_bytes: int) -> None:
        self.decoder = decoder
        self.budget = budget_bytes
        self.used = 0
        self.hits = 0  # tokens restored from the cache
        self._blocks: OrderedDict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = OrderedDict()

    def restore(self, slot: int, prompt: list[int], namespace: int = 0) -> int:
        """Copy the longest cached prefix of `prompt` into `slot`; the number of positions restored. The last
        prompt token is always left to compute: its logits choose the first answer token. Entries are kept
        per `namespace` (the weights that computed them: the base, or a variant)."""
        if self.budget <= 0:
            return 0
        restored = 0
        while restored + BLOCK < len(prompt):
            key = (namespace, *prompt[:restored + BLOCK])
            entry = self._blocks.get(key)
            if entry is None:
                break
            self._blocks.move_to_end(key)
            self.decoder.write_block(slot, restored, *entry)
            restored += BLOCK
        self.hits += restored
        return restored

    def store(self, slot: int, prompt: list[int], namespace: int = 0) -> None:
        """Remember the whole blocks of a prompt just prefilled into `slot`."""
        if self.budget <= 0:
            return
        for end in range(BLOCK, len(prompt) + 1, BLOCK):
            key = (namespace, *prompt[:end])
            if key in self._blocks:
                self._blocks.move_to_end(key)
                continue
            keys, values = self.decoder.read_block(slot, end - BLOCK, end)
            size = (keys.numel() + values.numel()) * keys.element_size()
            if size > self.budget:
                return
            self._blocks[key] = (keys.clone(), values.clone())
            self.used += size
            while self.used > self.budget:
                _, (old_keys, old_values) = self._blocks.popitem(last=False)
                self.used -= (old_keys.numel() + old_values.numel()) * old_keys.element_size()
