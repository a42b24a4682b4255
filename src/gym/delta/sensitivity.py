"""How much a rounding error in one weight matters, measured on calibration data.

For a linear layer y = W x, an error E in W changes the outputs by E x; over the calibration tokens
the squared change is sum_x ||E x||^2 = tr(E H E^T) with H = sum_x x x^T, the Gram matrix of the
layer's inputs. H is collected once (forward hooks, one pass of the fine-tuned model), so any number
of candidate encodings can be scored without running the model again. For the embedding, whose input
is a token id, H is diagonal: how often each token occurs. Without calibration data every input
direction counts the same (H = I) and the score is the plain squared error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def input_grams(model: Any, batches: list[torch.Tensor], names: list[str]) -> dict[str, torch.Tensor]:
    """{weight name: H} for the named linear weights (float64 sums over every calibration token) and, for
    the input embedding, the token counts."""
    modules = dict(model.named_modules())
    grams: dict[str, torch.Tensor] = {}
    hooks = []
    embedding_name = next((n for n, p in model.named_parameters() if p is model.get_input_embeddings().weight), None)

    def collect(weight_name: str) -> Callable[[torch.nn.Module, tuple[torch.Tensor, ...], Any], None]:
        def hook(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], output: Any) -> None:
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).double()
            grams[weight_name] = grams.get(weight_name, 0) + x.T @ x
        return hook

    for name in names:
        if name == embedding_name:
            continue
        module = modules.get(name.rsplit(".", 1)[0])
        if isinstance(module, torch.nn.Linear):
            hooks.append(module.register_forward_hook(collect(name)))
    try:
        with torch.no_grad():
            for batch in batches:
                model(input_ids=batch, use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    if embedding_name in names:
        vocab = model.get_input_embeddings().weight.shape[0]
        grams[embedding_name] = torch.bincount(torch.cat([b.reshape(-1) for b in batches]), minlength=vocab).double()
    return grams


def weighted_error(error: torch.Tensor, gram: torch.Tensor | None) -> float:
    """tr(E H E^T): the squared output change the weight error E causes on the calibration inputs."""
    e = error.double()
    if gram is None:
        return float((e * e).sum())
    if gram.ndim == 1:  # embedding rows, weighted by token frequency
        return float((gram[:, None] * e * e).sum())
    return float(((e @ gram) * e).sum())
