"""Serving one variant: the base loaded once into a ChatModel, the user's delta added to its weights.

Many variants in one batch (each row with its own delta, on one shared base) is the batched engine's
job; this is the single-variant path behind `serve_variant` and `gym variants chat`.
"""

from __future__ import annotations

from typing import Any

from gym.delta.apply import apply_delta
from gym.delta.format import load_delta
from gym.personalization.store import VariantStore


def variant_chat_model(store: VariantStore, base_model: str, user_id: str, **config: Any) -> Any:
    """A ChatModel answering as `user_id`'s variant of `base_model`."""
    from gym.infer.chat import ChatModel

    store.get(user_id)  # a clear error for an unknown user before the model loads
    if store.adapter_path(user_id).is_dir():  # a LoRA variant: merged on load, as any adapter
        return ChatModel({"model_name_or_path": base_model, "adapter_name_or_path": str(store.adapter_path(user_id)),
                          **config})
    path = store.delta_path(user_id)
    entries, header = load_delta(path)
    store.check_base(dict(header.get("base", {})), str(path))
    # float32 as the delta was made against: the base fingerprint is checked on the loaded weights.
    chat = ChatModel({"model_name_or_path": base_model, "infer_dtype": "float32", **config})
    apply_delta(chat.model, entries, header, path)
    return chat
