"""The safety gate on a delta: the base and the base with the delta added answer the gate's safety set, and the
gate (gym.safety.gate) compares their harmful compliance.

Every gate in Gym measures a delta against its base, because that is what each stores: `gym delta compress` the
compressed delta, `gym variants create` (and the service's fine-tuning jobs, which make variants) the user's
compressed variant, `gym soup contribute` the contribution. So the model that is judged is the one that would be
served, compression included, and the base is loaded once: it answers, then the delta is added to its weights in
place and the same model answers again (gym.infer.answers starts a fresh engine for each). The base's answers are
kept by its weight fingerprint (the delta header's), so gating many deltas of one base answers with it once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from gym.delta.apply import apply_delta
from gym.delta.compress import reconstruct
from gym.infer.answers import ModelAnswers
from gym.safety.gate import GateDecision, SafetyGate

logger = logging.getLogger(__name__)


def gate_delta(gate: SafetyGate, base: str, entries: dict[str, Any], header: dict[str, Any], *,
               source: str = "the delta", template: str | None = None) -> GateDecision:
    """The gate's decision on `base` + the delta (`entries`, `header`: a delta file's contents, or a
    CompressedDelta's before it is written). `template`: the chat format both answer in (default: the tokenizer's)."""
    gate.check()  # the set and the judge, before a model loads
    items = gate.items()
    model = ModelAnswers.load(base, template=template)
    fingerprint = str((header.get("base") or {}).get("fingerprint") or "")
    judge = gate.load_judge()
    try:
        logger.info("Safety gate: the base %s answers %s", base, gate.dataset)
        base_result = gate.evaluate(model, items, cache_key=f"{fingerprint}:{model.template}" if fingerprint else None,
                                    judge=judge)
        apply_delta(model.model, entries, header, source)
        logger.info("Safety gate: the base with %s answers %s", source, gate.dataset)
        candidate = gate.evaluate(model, items, judge=judge)
    finally:
        judge.close()
    return gate.decision(base_result, candidate)


def gate_dense(gate: SafetyGate, model: ModelAnswers, delta: dict[str, torch.Tensor], *,
               base_key: str | None = None) -> GateDecision:
    """The gate's decision on a loaded base (`model`) + a dense delta {parameter: tensor}, added in place and taken
    away again bit for bit (the soup's base serves every contribution's check). `base_key`: the base's fingerprint."""
    items = gate.items()
    key = f"{base_key}:{model.template}" if base_key else None
    judge = gate.load_judge()
    try:
        base_result = gate.evaluate(model, items, cache_key=key, judge=judge)
        with added(model.model, delta):
            candidate = gate.evaluate(model, items, judge=judge)
    finally:
        judge.close()
    return gate.decision(base_result, candidate)


@contextmanager
def added(model: Any, delta: dict[str, Any]) -> Iterator[Any]:
    """`with added(model, delta):` the model's parameters plus the delta (dense tensors or encoded entries) inside
    the block, restored bit for bit after."""
    params = dict(model.named_parameters())
    saved: dict[str, torch.Tensor] = {}
    try:
        with torch.no_grad():
            for name, value in delta.items():
                param = params[name]
                saved[name] = param.detach().clone()
                dense = value if isinstance(value, torch.Tensor) else reconstruct(value)
                param.add_(dense.to(device=param.device, dtype=param.dtype))
        yield model
    finally:
        with torch.no_grad():
            for name, value in saved.items():
                params[name].copy_(value)
