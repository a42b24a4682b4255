"""A dataset's first rows as the chosen stage will feed them: rendered by the model's chat format and tokenized
by the same encoders training uses (gym.data.processors), with what the loss is on marked apart from the
prompt. So the preview cannot disagree with training: it is the same code on the same rows.

Rows with images show them too, as thumbnails beside the text. With a vision-language model the text is what
training tokenizes: each image's placeholder expanded by the model's processor (a run of one media token, shown
once with its count, `<image>×16`). With a text model a dataset with images is refused, as training refuses it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from gym.config.stages.registry import get_stage
from gym.core.errors import DataError
from gym.core.kinds import DataKind
from gym.data.loader import load_examples
from gym.data.media import load_image
from gym.data.multimodal import MediaInputs
from gym.data.processors import (
    IGNORE_INDEX,
    encode_feedback,
    encode_labelled,
    encode_pairwise,
    encode_prompt,
    encode_supervised,
    encode_unsupervised,
)
from gym.data.registry import get_dataset_attrs
from gym.data.templates import ChatFormat, get_chat_format
from gym.models.loader import load_tokenizer, resolve_model_path
from gym.models.vision import is_multimodal, load_processor

if TYPE_CHECKING:
    from PIL import Image as PILImage

Segment = tuple[str, str | None]  # (text, "prompt" | "trained" | a label such as "chosen"), None: plain
THUMBNAIL = (256, 256)  # the gallery shows small copies: a preview need not send a 12-megapixel photo


@dataclass
class Preview:
    """What the preview shows: the marked text of the rows, and the images in them with a caption naming the row."""

    segments: list[Segment] = field(default_factory=list)
    images: list[tuple[PILImage.Image, str]] = field(default_factory=list)


@lru_cache(maxsize=4)
def _model(model: str, template: str | None) -> tuple[ChatFormat, MediaInputs | None]:
    """The chat format training renders with, and for a vision-language model how its processor takes media (as
    gym.train.workflow.prepare builds them)."""
    path = resolve_model_path(model)
    if is_multimodal(path):
        processor = load_processor(path)
        return get_chat_format(processor.tokenizer, template), MediaInputs.for_processor(processor, path)
    return get_chat_format(load_tokenizer(path), template), None


def _runs(chat: ChatFormat, ids: list[int], labels: list[int], media: MediaInputs | None = None) -> list[Segment]:
    """Consecutive tokens with the same role, decoded together (decoding token by token splits characters)."""
    segments: list[Segment] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or (labels[i] == IGNORE_INDEX) != (labels[start] == IGNORE_INDEX):
            label = "prompt" if labels[start] == IGNORE_INDEX else "trained"
            segments.append((_collapse_media(chat.tokenizer.decode(ids[start:i]), media), label))
            start = i
    return segments


def _collapse_media(text: str, media: MediaInputs | None) -> str:
    """A run of one media token (hundreds of `<|image_pad|>` for a Qwen-VL image) written once with its count."""
    if media is None:
        return text
    tokens = [media.tokenizer.convert_ids_to_tokens(token_id) for token_id in sorted(media.media_ids)]
    for token in (t for t in tokens if isinstance(t, str) and t):
        def counted(run: re.Match[str], token: str = token) -> str:
            return f"{token}×{len(run.group()) // len(token)}"

        text = re.sub(f"(?:{re.escape(token)}){{2,}}", counted, text)
    return text


def preview_rows(model: str, dataset: str, dataset_dir: str, stage: str, template: str | None = None,
                 cutoff_len: int = 2048, rows: int = 3) -> Preview:
    """The first `rows` examples of `dataset` as `stage` trains on them: marked text segments, and the rows'
    images."""
    chat, media = _model(model, template or None)
    kind = get_stage(stage).data_kind
    preview = Preview()
    for attr in get_dataset_attrs(dataset, dataset_dir):
        for n, example in enumerate(load_examples(attr, kind.value, max_samples=rows, media=media is not None),
                                    start=1):
            where = f"{attr.name} · row {n}"
            preview.segments.append((f"\n── {where} ──\n", None))
            preview.segments += _example_segments(example, chat, kind, cutoff_len, media)
            preview.images += [(_thumbnail(item, f"{example.source}: images[{k}]"), f"{where} · image {k + 1}")
                               for k, item in enumerate(example.images)]
    return preview


def _thumbnail(item: str, where: str) -> PILImage.Image:
    """A checked image (a path or data URL, as the row was read) -> a small RGB copy."""
    with load_image(item, where=where) as image:
        image.draft("RGB", THUMBNAIL)  # a JPEG decodes at a fraction of its size: no need for every pixel
        small = image.convert("RGB")
    small.thumbnail(THUMBNAIL)
    return small


def _example_segments(example: Any, chat: ChatFormat, kind: DataKind, cutoff_len: int,
                      media: MediaInputs | None = None) -> list[Segment]:
    decode = chat.tokenizer.decode
    if kind == DataKind.SUPERVISED:
        row = encode_supervised(example, chat, cutoff_len, media=media)
        if row is None:
            return [("(nothing to learn after cutoff_len)", None)]
        return _runs(chat, row["input_ids"], row["labels"], media)
    if kind == DataKind.UNSUPERVISED:
        return [seg for chunk in encode_unsupervised(example, chat, cutoff_len)
                for seg in _runs(chat, chunk["input_ids"], chunk["labels"])]
    if example.has_media():  # as gym.data.loader refuses them when training
        raise DataError(f"{example.source} has media, and {kind.value} rows with images, videos or audio are not "
                        "read yet (sft is); use a text-only dataset for this stage.")
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
    if kind == DataKind.LABELLED:  # the text the classifier reads, and its class
        labelled = encode_labelled(example, chat, cutoff_len)
        return [(decode(labelled["input_ids"]), "prompt"), (f"\nclass: {labelled['label']}", "answer")]
    prompt = encode_prompt(example, chat, cutoff_len)
    if prompt is None:
        return [("(the prompt fills cutoff_len)", None)]
    answer = [(f"\nreference answer: {prompt['answer']}", "answer")] if "answer" in prompt else []
    return [(prompt["prompt"], "prompt"), *answer]
