"""Preference rows with images, videos or audio, handed to TRL's DPOTrainer and KTOTrainer (stages dpo, tdpo, kto).

TRL 1.16 reads a dataset two ways. Rows with an `images` column are raw conversations: it tokenizes them in its
vision collators, skips `_prepare_dataset` (where Gym's KTO takes batch size 1 past TRL's check) and refuses
`precompute_ref_log_probs`. Rows of token ids take its text path, whose losses hand every batch tensor but the masks
to the model: pixel_values reach the policy's forward, the reference's (the base with the adapter disabled, or
`ref_model`) and KTO's KL pass alike. Gym's rows are tokenized already (the prompt's placeholders expanded by the
processor, as in sft), so they take the text path: the media items travel in `media_<kind>` columns, which TRL does
not read, and the collator is TRL's own text collator with the batch's media tensors added (MediaBatchCollator).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gym.data.collators import MediaBatchCollator
from gym.data.media import KINDS as MEDIA_KINDS
from gym.data.multimodal import MediaInputs

MEDIA_COLUMN = "media_{kind}"


def trl_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Gym's rows with their media items moved to `media_<kind>`, present in every row (an empty list for a text
    row): `datasets.Dataset.from_list` takes its columns from the first row, so a column the first row lacks would
    be dropped, and the later rows' images with it."""
    kinds = [kind for kind in MEDIA_KINDS if any(kind in row for row in rows)]
    return [{**{key: value for key, value in row.items() if key not in MEDIA_KINDS},
             **{MEDIA_COLUMN.format(kind=kind): row.get(kind, []) for kind in kinds}} for row in rows]


def media_collator(ids: Callable[[list[dict[str, Any]]], dict[str, Any]], media: MediaInputs,
                   repeats: int) -> MediaBatchCollator:
    """`ids` (TRL's text collator) plus the batch's media tensors; `repeats`: 2 for DPO's chosen-then-rejected
    layout, 1 for KTO (its KL sequences reuse the rows' prompts, so the same media)."""
    return MediaBatchCollator(ids, media, repeats=repeats, column=MEDIA_COLUMN)
