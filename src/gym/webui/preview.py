"""A dataset's first rows as the chosen stage will feed them: rendered by the model's chat format and tokenized
by the same encoders training uses (gym.data.processors), with what the loss is on marked apart from the
prompt. So the preview cannot disagree with training: it is the same code on the same rows."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from gym.config.stages.registry import get_stage
from gym.core.kinds import DataKind
from gym.data.loader import load_examples
from gym.data.processors import (
    IGNORE_INDEX,
    encode_feedback,
    encode_pairwise,
    encode_prompt,
    encode_supervised,
    encode_unsupervised,
)
from gym.data.registry import get_dataset_attrs
from gym.data.templates import ChatFormat, get_chat_format
from gym.models.loader import load_tokenizer, resolve_model_path

Segment = tuple[str, str | None]  # (text, "prompt" | "trained" | a label such as "chosen"), None: plain


@lru_cache(maxsize=4)
def _chat_format(model: str, template: str | None) -> ChatFormat:
    return get_chat_format(load_tokenizer(resolve_model_path(model)), template)


def _runs(chat: ChatFormat, ids: list[int], labels: list[int]) -> list[Segment]:
    """Consecutive tokens with the same role, decoded together (decoding token by token splits characters)."""
    segments: list[Segment] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or (labels[i] == IGNORE_INDEX) != (labels[start] == IGNORE_INDEX):
            label = "prompt" if labels[start] == IGNORE_INDEX else "trained"
            segments.append((chat.tokenizer.decode(ids[start:i]), label))
            start = i
    return segments


def preview_rows(model: str, dataset: str, dataset_dir: str, stage: str, template: str | None = None,
                 cutoff_len: int = 2048, rows: int = 3) -> list[Segment]:
    """The first `rows` examples of `dataset` as `stage` trains on them, as marked text segments."""
    chat = _chat_format(model, template or None)
    kind = get_stage(stage).data_kind
    segments: list[Segment] = []
    for attr in get_dataset_attrs(dataset, dataset_dir):
        for n, example in enumerate(load_examples(attr, kind.value, max_samples=rows), start=1):
            segments.append((f"\n── {attr.name} · row {n} ──\n", None))
            segments += _example_segments(example, chat, kind, cutoff_len)
    return segments


def _example_segments(example: Any, chat: ChatFormat, kind: DataKind, cutoff_len: int) -> list[Segment]:
    decode = chat.tokenizer.decode
    if kind == DataKind.SUPERVISED:
        row = encode_supervised(example, chat, cutoff_len)
        return _runs(chat, row["input_ids"], row["labels"]) if row else [("(nothing to learn after cutoff_len)", None)]
    if kind == DataKind.UNSUPERVISED:
        return [seg for chunk in encode_unsupervised(example, chat, cutoff_len)
                for seg in _runs(chat, chunk["input_ids"], chunk["labels"])]
    if kind == DataKind.PAIRWISE:
        pair = encode_pairwise(example, chat, cutoff_len)
        if pair is None:
            return [("(the prompt fills cutoff_len)", None)]
        return [(decode(pair["prompt_ids"]), "prompt"), (decode(pair["chosen_ids"]), "chosen"),
                ("\n", None), (decode(pair["rejected_ids"]), "rejected")]
    if kind == DataKind.FEEDBACK:
        fed = encode_feedback(example, chat, cutoff_len)
        if fed is None:
            return [("(the prompt fills cutoff_len)", None)]
        return [(decode(fed["prompt_ids"]), "prompt"),
                (decode(fed["completion_ids"]), "desirable" if fed["label"] else "undesirable")]
    prompt = encode_prompt(example, chat, cutoff_len)
    if prompt is None:
        return [("(the prompt fills cutoff_len)", None)]
    answer = [(f"\nreference answer: {prompt['answer']}", "answer")] if "answer" in prompt else []
    return [(prompt["prompt"], "prompt"), *answer]
