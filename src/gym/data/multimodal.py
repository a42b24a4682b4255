"""Rows with images, videos or audio -> the token ids and tensors a vision-language model takes.

The conversation is rendered exactly as for a text model, with the rows' placeholders (`<image>`, `<video>`,
`<audio>`) left in the text. Each rendered piece that holds placeholders is then tokenized by the model's own
processor, with that piece's media: the processor knows its family's expansion (16 `<image>` tokens for a
56-pixel LLaVA, a grid-sized run of `<|image_pad|>` between vision markers for Qwen2-VL, rows and columns of
tiles for Idefics3), so Gym never counts media tokens itself. Before that, each placeholder becomes the text the
family's processor expands (`gym.models.vision.media_placeholder`).

Only ids and the media items (paths or data URLs) are stored per row; the pixels are decoded again when a batch
is collated, where the processor turns the batch's media into `pixel_values` (and `image_grid_thw`,
`image_sizes`, ... whatever the family needs) in the order their tokens appear, which is the order the model
consumes them. Labels never cover media tokens.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gym.core.errors import DataError
from gym.data.formats import Example
from gym.data.media import KINDS, PLACEHOLDERS, MediaError, read_image

# Qwen's processors expand a bare pad token, and the model also needs the start and end markers around it
# (LLaMA-Factory's qwen2_vl plugin writes the same).
_QWEN_WRAPPED = {"images": ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>"),
                 "videos": ("<|vision_start|>", "<|video_pad|>", "<|vision_end|>"),
                 "audios": ("<|audio_bos|>", "<|AUDIO|>", "<|audio_eos|>")}
_TOKEN_ATTR = {"images": "image_token", "videos": "video_token", "audios": "audio_token"}
VIDEO_FAMILIES = "Qwen2-VL, Qwen2.5-VL, Qwen3-VL, LLaVA-NeXT-Video, LLaVA-OneVision"
AUDIO_FAMILIES = "Qwen2-Audio, Qwen2.5-Omni (thinker)"


class MediaUnsupported(DataError):
    """The model takes no media of this kind."""


def media_placeholder(processor: Any, kind: str, model_name: str = "this model") -> str:
    """The text the processor expands for one image, video or audio (`kind`: images, videos, audios); a
    MediaUnsupported naming the families that take `kind` when this model takes none."""
    token = getattr(processor, _TOKEN_ATTR[kind], None)
    if kind == "images" and getattr(processor, "boi_token", None):
        return str(processor.boi_token)  # Gemma 3 expands its begin-of-image token into the whole image sequence
    vocab = processor.tokenizer.get_vocab()
    start, pad, end = _QWEN_WRAPPED[kind]
    if token == pad and start in vocab and end in vocab:
        return start + pad + end
    if not token:
        what = {"images": "images", "videos": "videos", "audios": "audio"}[kind]
        families = {"videos": VIDEO_FAMILIES, "audios": AUDIO_FAMILIES}.get(kind, "a vision-language model")
        raise MediaUnsupported(f"{model_name} takes no {what} (its processor, {type(processor).__name__}, has "
                               f"no {_TOKEN_ATTR[kind]}). Use a model that does ({families}), or drop the {kind} "
                               "column.")
    return str(token)


def media_token_ids(processor: Any) -> set[int]:
    """Ids that stand for media features, which no label may cover."""
    tokenizer = processor.tokenizer
    ids: set[int] = set()
    # Gemma 3's processor names its begin-of-image marker as the image token; the soft tokens the features fill
    # are the tokenizer's image_token, so both are asked.
    for owner in (processor, tokenizer):
        for attr in ("image_token", "video_token", "audio_token", "boi_token", "eoi_token"):
            token = getattr(owner, attr, None)
            if isinstance(token, str) and token:
                token_id = tokenizer.convert_tokens_to_ids(token)
                if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
                    ids.add(token_id)
    vocab = tokenizer.get_vocab()
    for wrapped in _QWEN_WRAPPED.values():
        ids.update(vocab[t] for t in wrapped if t in vocab)
    return ids


# Per-token outputs some processors add beside input_ids (Gemma 3 marks image tokens for bidirectional attention).
PER_TOKEN_KEYS = ("token_type_ids", "mm_token_type_ids")
_PROCESSOR_ARGUMENT = {"images": "images", "videos": "videos", "audios": "audio"}


@dataclass
class MediaInputs:
    """What the data pipeline needs from a multimodal model: its processor, the text each kind's placeholder
    becomes (`placeholders`), why a kind cannot be used (`refused`: kind -> reason), and the media token ids."""

    processor: Any
    placeholders: dict[str, str]
    refused: dict[str, str]
    media_ids: set[int]
    image_max_pixels: int = 768 * 768
    image_min_pixels: int = 32 * 32
    audio_sampling_rate: int = 16000
    _audio_loader: Callable[..., Any] | None = field(default=None, repr=False)

    @classmethod
    def for_processor(cls, processor: Any, model_name: str, *, image_max_pixels: int = 768 * 768,
                      image_min_pixels: int = 32 * 32, audio_sampling_rate: int = 16000) -> MediaInputs:
        """The placeholders a model's processor expands, and the reason for each kind it cannot take."""
        placeholders, refused = {}, {}
        for kind in KINDS:
            try:
                placeholders[kind] = media_placeholder(processor, kind, model_name)
            except MediaUnsupported as exc:
                refused[kind] = str(exc)
        return cls(processor, placeholders, refused, media_token_ids(processor), image_max_pixels=image_max_pixels,
                   image_min_pixels=image_min_pixels, audio_sampling_rate=audio_sampling_rate)

    @property
    def tokenizer(self) -> Any:
        return self.processor.tokenizer

    def check(self, example: Example) -> None:
        """A row with media the model cannot take is that row's error."""
        for kind in KINDS:
            if getattr(example, kind) and kind in self.refused:
                raise DataError(f"{example.source}: field '{kind}': {self.refused[kind]}")

    def decode(self, kind: str, items: list[str], where: str) -> list[Any]:
        """Items of one kind -> what the processor takes: RGB images within the pixel limits, video paths (the
        processor's own video loader reads them), audio waveforms at the model's sampling rate."""
        if kind == "images":
            return [read_image(item, where=f"{where}: images[{i}]", max_pixels=self.image_max_pixels,
                               min_pixels=self.image_min_pixels) for i, item in enumerate(items)]
        if kind == "audios":
            return [self._load_audio(item, f"{where}: audios[{i}]") for i, item in enumerate(items)]
        return list(items)

    def _load_audio(self, item: str, where: str) -> Any:
        try:
            from transformers.audio_utils import load_audio
        except ImportError as exc:  # pragma: no cover - transformers always has it
            raise MediaError(where, f"cannot read audio: {exc}") from None
        try:
            return load_audio(item, sampling_rate=self.audio_sampling_rate)
        except ImportError as exc:
            raise MediaError(where, f"reading audio needs librosa ({exc}): pip install librosa") from None
        except Exception as exc:  # audio decoders raise many types for a broken file
            raise MediaError(where, f"could not read the audio file {item}: {exc}") from None

    def _run(self, text: str, media: dict[str, list[Any]]) -> Any:
        for kind, tag in PLACEHOLDERS.items():
            if kind in self.placeholders:
                text = text.replace(tag, self.placeholders[kind])
        kwargs: dict[str, Any] = {_PROCESSOR_ARGUMENT[kind]: items for kind, items in media.items() if items}
        if "audio" in kwargs:
            kwargs["sampling_rate"] = self.audio_sampling_rate
        return self.processor(text=[text], add_special_tokens=False, return_tensors="pt", **kwargs)

    def encode(self, text: str, media: dict[str, list[Any]], where: str) -> list[int]:
        """A rendered piece and its decoded media -> its ids, media expanded."""
        try:
            out = self._run(text, media)
        except (ValueError, RuntimeError, TypeError, OSError) as exc:
            raise DataError(f"{where}: the model's processor refused the row's media: "
                            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
        ids: list[int] = out["input_ids"][0].tolist()
        return ids

    def features(self, media: dict[str, list[Any]], input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """A batch's decoded media -> the model's media tensors (pixel_values, image_grid_thw, ...), through the
        processor on the placeholders alone, so every family gets exactly the keys its forward takes. A per-token
        type the processor adds (Gemma 3's token_type_ids: 1 on image tokens) is mapped onto the batch's ids."""
        text = "".join(self.placeholders[kind] * len(items) for kind, items in media.items() if items)
        out = self._run(text, media)
        tensors = {key: value for key, value in out.items()
                   if key not in ("input_ids", "attention_mask", *PER_TOKEN_KEYS) and isinstance(value, torch.Tensor)}
        for key in PER_TOKEN_KEYS:
            if key in out:
                types = torch.zeros_like(input_ids)
                for token_id, kind in zip(out["input_ids"][0].tolist(), out[key][0].tolist()):
                    if kind:
                        types[input_ids == token_id] = kind
                tensors[key] = types
        return tensors


class RowTokenizer:
    """Tokenizes one row's rendered pieces in order, handing each piece the media its placeholders take."""

    def __init__(self, media: MediaInputs, example: Example) -> None:
        media.check(example)
        self.media, self.source = media, example.source
        self.queues = {kind: deque(media.decode(kind, getattr(example, kind), str(example.source)))
                       for kind in KINDS}

    def __call__(self, text: str) -> list[int]:
        wanted = {kind: text.count(tag) for kind, tag in PLACEHOLDERS.items()}
        if not any(wanted.values()):
            ids: list[int] = self.media.tokenizer.encode(text, add_special_tokens=False)
            return ids
        taken: dict[str, list[Any]] = {}
        for kind, count in wanted.items():
            if count > len(self.queues[kind]):
                raise DataError(f"{self.source}: the rendered conversation has more {PLACEHOLDERS[kind]} "
                                f"placeholders than the row has {kind} (a placeholder in the system prompt or a "
                                "tool description?).")
            taken[kind] = [self.queues[kind].popleft() for _ in range(count)]
        return self.media.encode(text, taken, str(self.source))

    def finish(self) -> None:
        """Every media item must have found its placeholder."""
        left = [kind for kind in KINDS if self.queues[kind]]
        if left:
            raise DataError(f"{self.source}: {len(self.queues[left[0]])} of the row's {left[0]} found no "
                            f"{PLACEHOLDERS[left[0]]} in the rendered conversation.")


def media_fields(example: Example) -> dict[str, list[str]]:
    return {kind: list(getattr(example, kind)) for kind in KINDS if getattr(example, kind)}
