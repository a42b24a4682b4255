"""What BitDelta and DeltaQuant share: the compressed result, dense entries, and the size/error report."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gym.delta.format import DENSE, fingerprint, save_delta
from gym.delta.tensor_quant import Encoded, dequantize, encoded_bytes, relative_error
from gym.delta.weights import Delta, parameters


@dataclass
class EntryReport:
    name: str
    kind: str
    encoding: str
    numel: int
    bytes: int
    relative_error: float  # ||reconstructed delta - delta|| / ||delta||


@dataclass
class CompressedDelta:
    """A compressed fine-tune: what goes into the file, and how well each parameter was kept."""

    entries: dict[str, Encoded | torch.Tensor]
    header: dict[str, Any]
    report: list[EntryReport] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def payload_bytes(self) -> int:
        return sum(r.bytes for r in self.report)

    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        """Write the delta file (temp name + rename); an existing file is replaced only with `overwrite`."""
        return save_delta(path, self.entries, self.header, overwrite=overwrite)


def dense_entry(delta: Delta, base_value: torch.Tensor, tuned_value: torch.Tensor) -> torch.Tensor:
    """The delta at the fine-tune's own precision, or float64 where that would not give the fine-tune back
    exactly: a dense entry must reconstruct its parameter bit for bit."""
    stored = delta.value.to(tuned_value.dtype)
    if torch.equal((base_value.to(stored.dtype) + stored).to(tuned_value.dtype), tuned_value):
        return stored
    return tuned_value.double() - base_value.double()


def reconstruct(entry: Encoded | torch.Tensor) -> torch.Tensor:
    return dequantize(entry) if isinstance(entry, Encoded) else entry.float()


def report_for(delta: Delta, entry: Encoded | torch.Tensor) -> EntryReport:
    if isinstance(entry, Encoded):
        return EntryReport(delta.name, delta.kind, entry.method.value, delta.value.numel(), encoded_bytes(entry),
                           relative_error(delta.value, entry))
    # dense_entry guarantees an exact rebuild
    return EntryReport(delta.name, delta.kind, DENSE, delta.value.numel(), entry.numel() * entry.element_size(), 0.0)


def finish(entries: dict[str, Encoded | torch.Tensor], deltas: list[Delta], base: Any, method: str,
           options: dict[str, Any], started: float, base_name: str | None, extra: dict[str, Any] | None = None
           ) -> CompressedDelta:
    """Wrap encoded entries into a CompressedDelta with its header (base fingerprint, options, sizes)."""
    report = [report_for(d, entries[d.name]) for d in deltas]
    base_params = parameters(base)
    header = {
        "method": method,
        "options": options,
        "base": {"fingerprint": fingerprint(base_params), "name": base_name,
                 "parameters": sum(p.numel() for p in base_params.values())},
        "stats": {"payload_bytes": sum(r.bytes for r in report), "changed_parameters": len(deltas),
                  "entries": {r.name: {"kind": r.kind, "encoding": r.encoding, "numel": r.numel, "bytes": r.bytes,
                                       "relative_error": r.relative_error} for r in report}},
        **(extra or {}),
    }
    return CompressedDelta(entries, header, report, time.perf_counter() - started)
