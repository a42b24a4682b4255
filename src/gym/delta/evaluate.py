"""How much of a fine-tune's gain a compressed delta keeps: eval loss of base, fine-tune and reconstruction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gym.config.data import DataArguments
from gym.data.loader import get_dataset
from gym.data.templates import get_chat_format
from gym.models.scoring import token_nll


@dataclass
class GainKept:
    base_loss: float
    finetuned_loss: float
    reconstructed_loss: float

    @property
    def kept(self) -> float:
        """(base - reconstruction) / (base - fine-tune): 1.0 keeps the whole gain, 0.0 none of it."""
        gain = self.base_loss - self.finetuned_loss
        return float("nan") if gain == 0 else (self.base_loss - self.reconstructed_loss) / gain


def eval_rows(tokenizer: Any, dataset: str, dataset_dir: str, cutoff_len: int, max_samples: int | None,
              seed: int = 42) -> list[dict[str, list[int]]]:
    """Supervised rows (loss on the answers, as sft trains) from a Gym dataset name or file."""
    args = DataArguments(dataset=dataset, dataset_dir=dataset_dir, cutoff_len=cutoff_len, max_samples=max_samples)
    return get_dataset(args, get_chat_format(tokenizer), "supervised", seed=seed).train


def eval_loss(model: Any, rows: list[dict[str, list[int]]], batch_size: int = 8) -> float:
    """Mean cross-entropy per supervised token over `rows` (gym eval's perplexity is exp of it)."""
    nll, counts = token_nll(model, rows, batch_size)
    return sum(nll) / max(sum(counts), 1)
