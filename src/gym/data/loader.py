"""The data pipeline: dataset names -> validated examples -> token ids -> (packed) train/eval sets."""

from __future__ import annotations

import logging
import os
import random
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from gym.config.data import DataArguments
from gym.core.errors import DataError
from gym.core.names import did_you_mean
from gym.data.formats import Example, convert_row
from gym.data.media import KINDS as MEDIA_KINDS
from gym.data.multimodal import MediaInputs
from gym.data.packing import pack
from gym.data.processors import (
    encode_feedback,
    encode_labelled,
    encode_pairwise,
    encode_prompt,
    encode_supervised,
    encode_unsupervised,
)
from gym.data.readers import RowSource, read_rows
from gym.data.registry import DatasetAttr, get_dataset_attrs
from gym.data.templates import ChatFormat

logger = logging.getLogger(__name__)


@dataclass
class TokenizedData:
    train: list[dict[str, list[int]]]
    eval: list[dict[str, list[int]]] | None
    stats: dict[str, Any] = field(default_factory=dict)


def _hub_rows(attr: DatasetAttr) -> Iterator[tuple[RowSource, Any]]:
    import datasets

    try:
        data = datasets.load_dataset(attr.path, name=attr.subset, split=attr.split)
    except Exception as exc:  # datasets raises many types for missing/offline datasets
        named = f"'{attr.name}' (hub dataset {attr.path})" if attr.name != attr.path else f"hub dataset '{attr.path}'"
        if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
            raise DataError(
                f"Dataset {named} lives on the Hugging Face Hub, and this process is offline (HF_HUB_OFFLINE=1). "
                f"Get it once with network (a run without HF_HUB_OFFLINE caches it, or `hf download --repo-type "
                f"dataset {attr.path}`), or point `dataset:` at a local file."
            ) from None
        raise DataError(
            f"Could not load {named} (split {attr.split}): {exc}. Offline? Download it once with "
            "network, or point `dataset:` at a local file."
        ) from None
    for i, row in enumerate(data, start=1):
        yield RowSource(attr.path, i), row


def raw_rows(attr: DatasetAttr) -> Iterator[tuple[RowSource, Any]]:
    """Every row as stored, with where it came from (a file's path and row, or the hub id and index)."""
    return _hub_rows(attr) if attr.load_from == "hub" else read_rows(attr.path)


def load_examples(attr: DatasetAttr, kind: str, max_samples: int | None = None, media: bool = False,
                  seed: int = 42) -> list[Example]:
    """Read and check the rows. `media`: whether the model can take images, videos and audios; when it cannot,
    a dataset with them is refused, but only after every row was read and checked, so a broken row is reported
    as that row's error first.

    An entry's `num_samples` draws that many rows at random (`seed`), every row once before any twice, as
    LLaMA-Factory does: fewer than the file holds is a random subset, more repeats rows. `max_samples` then keeps
    the first rows of what is left."""
    examples: list[Example] = []
    checked = False
    for source, row in raw_rows(attr):
        if not attr.num_samples and max_samples is not None and len(examples) >= max_samples:
            break
        if not checked and isinstance(row, dict):
            _check_mapped_columns(attr, row)
            checked = True
        examples.append(convert_row(attr, source, row, kind))
    if not examples:
        raise DataError(f"Dataset '{attr.name}' ({attr.path}) has no rows.")
    if attr.num_samples:
        examples = _draw(examples, attr.num_samples, random.Random(seed))
        examples = examples[:max_samples] if max_samples else examples
    if not media:
        _refuse_media(examples)
    return examples


def _draw(examples: list[Example], count: int, rng: random.Random) -> list[Example]:
    order = list(range(len(examples)))
    rng.shuffle(order)
    chosen = order[:count] + [rng.randrange(len(examples)) for _ in range(count - len(order))]
    return [examples[i] for i in chosen]


def _check_mapped_columns(attr: DatasetAttr, first: dict[str, Any]) -> None:
    """A column dataset_info.json names that no row has is a misspelling: refused, where reading on would leave
    an optional column (input, system, history) out of every row without a word. Only when the first row lacks
    one are the other rows' keys read, since a column may be absent from some rows."""
    absent = {key: column for key, column in attr.mapped.items() if column not in first}
    if not absent:
        return
    keys: set[str] = set()
    for _, row in raw_rows(attr):
        if isinstance(row, dict):
            keys.update(row)
    for key, column in absent.items():
        if column not in keys:
            listed = ", ".join(repr(k) for k in sorted(keys)) or "none"
            raise DataError(f"Dataset '{attr.name}' ({attr.path}): dataset_info.json maps '{key}' to the column "
                            f"'{column}', which no row has.{did_you_mean(column, sorted(keys))} The rows' keys: "
                            f"{listed}.")


def _refuse_media(examples: list[Example], reason: str | None = None) -> None:
    """The first row with media is an error: the model is a text model, or (`reason`) the job cannot take media."""
    for example in examples:
        kinds = [kind for kind in MEDIA_KINDS if getattr(example, kind)]
        if kinds and reason:
            raise DataError(f"{example.source} has {kinds[0]}, and {reason}")
        if kinds:
            raise DataError(
                f"{example.source} has {kinds[0]}, and the model is a text model: training on the text alone "
                f"would teach answers about {kinds[0]} the model never sees. Use a vision-language model "
                "(docs/multimodal.md lists the families; `tiny-llava` is a tiny one built offline), or a text-only "
                "dataset.")


ENCODERS = {"pairwise": encode_pairwise, "feedback": encode_feedback, "prompt": encode_prompt,
            "labelled": encode_labelled}
# The kinds whose rows carry media to the model (the prompts' placeholders expanded by its processor).
MEDIA_DATA_KINDS = ("supervised", "pairwise", "feedback")


def _encode_all(examples: list[Example], chat: ChatFormat, data_args: DataArguments,
                kind: str, media: MediaInputs | None = None) -> tuple[list[dict[str, Any]], int]:
    if media is not None and kind not in MEDIA_DATA_KINDS:
        _refuse_media(examples, f"{kind} rows with images, videos or audio are not read (supervised, pairwise and "
                      "feedback rows are); use a text-only dataset for this stage.")
    if kind == "unsupervised":
        encoded: list[dict[str, Any]] = []
        for ex in examples:
            encoded += encode_unsupervised(ex, chat, data_args.cutoff_len)
        return encoded, 0
    if kind == "supervised":
        encode = partial(encode_supervised, chat=chat, cutoff_len=data_args.cutoff_len,
                         train_on_prompt=data_args.train_on_prompt, mask_history=data_args.mask_history, media=media)
    elif kind in MEDIA_DATA_KINDS:
        encode = partial(ENCODERS[kind], chat=chat, cutoff_len=data_args.cutoff_len, media=media)
    else:
        encode = partial(ENCODERS[kind], chat=chat, cutoff_len=data_args.cutoff_len)
    # The processor and decoded media stay in this process (a pool would pickle the processor per task).
    workers = 1 if media is not None else data_args.preprocessing_num_workers or 1
    if workers > 1 and len(examples) >= 2000:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(workers) as pool:
            results = pool.map(encode, examples, chunksize=256)
    else:
        results = [encode(ex) for ex in examples]
    kept = [r for r in results if r is not None]
    return kept, len(results) - len(kept)


def mix(parts: list[list[Example]], strategy: str, probs: list[float] | None, seed: int) -> list[Example]:
    """Several datasets' rows -> one list, by LLaMA-Factory's `mix_strategy`: concat, or interleaved as
    datasets.interleave_datasets interleaves them (the same rows in the same order for the same seed):
    interleave_under stops when the first dataset runs out, interleave_over when every one has run out at least
    once, starting the exhausted ones again. Without `probs` one row of each in turn; with them each next row's
    dataset is drawn at random."""
    if len(parts) == 1 or strategy == "concat":
        return [example for part in parts for example in part]
    if probs is not None and len(probs) != len(parts):
        raise DataError(f"interleave_probs has {len(probs)} chances for {len(parts)} datasets: give one per dataset.")
    lengths = [len(part) for part in parts]
    over = strategy == "interleave_over"
    if probs is None:
        return [parts[d][r % lengths[d]] for r in range(max(lengths) if over else min(lengths))
                for d in range(len(parts))]
    import numpy as np

    rng = np.random.default_rng(seed)
    chances = [p / sum(probs) for p in probs]  # validated to sum to 1 within 0.01
    exhausted, position, mixed = [False] * len(parts), [0] * len(parts), []
    while not (all(exhausted) if over else any(exhausted)):
        for d in (int(i) for i in rng.choice(len(parts), size=1000, p=chances)):
            if all(exhausted) if over else any(exhausted):
                break
            mixed.append(parts[d][position[d]])
            position[d] += 1
            if position[d] == lengths[d]:
                exhausted[d], position[d] = True, 0
    return mixed


def _collect(names: str | None, data_args: DataArguments, kind: str, seed: int,
             media: bool = False, refuse_media: str | None = None) -> list[Example]:
    parts: list[list[Example]] = []
    for attr in get_dataset_attrs(names, data_args.dataset_dir, data_args.media_dir):
        loaded = load_examples(attr, kind, None if data_args.seed_shuffle_datasets else data_args.max_samples,
                               media=media, seed=seed)
        if media and refuse_media:
            _refuse_media(loaded, refuse_media)
        if data_args.seed_shuffle_datasets:
            random.Random(seed).shuffle(loaded)
            loaded = loaded[: data_args.max_samples] if data_args.max_samples else loaded
        logger.info("Dataset %s: %d rows", attr.name, len(loaded))
        parts.append(loaded)
    examples = mix(parts, data_args.mix_strategy, data_args.interleave_probs, seed)
    if len(parts) > 1 and data_args.mix_strategy != "concat":
        logger.info("Mixed %d datasets (%s): %d rows", len(parts), data_args.mix_strategy, len(examples))
    return examples


def _token_stats(rows: list[dict[str, Any]]) -> dict[str, int]:
    if "input_ids" in rows[0] and "labels" in rows[0]:
        return {"tokens": sum(len(e["input_ids"]) for e in rows),
                "supervised_tokens": sum(sum(1 for x in e["labels"] if x != -100) for e in rows)}
    return {"tokens": sum(sum(len(v) for k, v in e.items() if k.endswith("_ids")) for e in rows)}


def _require_tools(examples: list[Example], chat: ChatFormat) -> None:
    """Rows with tools or calls need a format that renders them: fail before tokenizing anything, naming a row."""
    fmt, checked = None, False
    for example in examples:
        if not checked and (example.tools or any(m.get("tool_calls") for m in example.messages)):
            fmt, checked = chat.require_tools(example.source), True
        if fmt is not None and not fmt.layout.parallel and any(len(m.get("tool_calls") or ()) > 1
                                                                for m in example.messages):
            raise DataError(f"{example.source}: an answer makes several calls at once, and the {fmt.name} tool "
                            "format has no parallel calls. Split them into one call per answer, or set "
                            "`tool_format:` to one with parallel calls.")


# Why an encoder drops a row (it returns None), per kind; unsupervised and labelled rows are never dropped.
_NOTHING_FITS: defaultdict[str, str] = defaultdict(lambda: "no answer token fits", {
    "supervised": "no answer token to learn fits (with mask_history, none of the last answer)",
    "prompt": "no prompt leaves room for a generated answer",
    "pairwise": "no answer token fits after the prompt", "feedback": "no answer token fits after the prompt",
})


def get_dataset(data_args: DataArguments, chat: ChatFormat, kind: str, seed: int = 42,
                packing: bool = False, media: MediaInputs | None = None,
                refuse_media: str | None = None) -> TokenizedData:
    """Load, validate, tokenize, split and (optionally) pack.

    `kind`: unsupervised, supervised, pairwise, feedback, prompt or labelled (see gym.data.formats). `media`: the
    model's processor glue when it is a multimodal model (gym.data.multimodal); rows with media need it.
    `refuse_media`: why the job cannot take rows with media even so (the end of a sentence naming the first such
    row), checked as the rows are read, before anything is tokenized."""
    if not data_args.dataset:
        raise DataError("No training data: set `dataset:` to a name from dataset_info.json or a file path.")
    if data_args.streaming:
        logger.warning("streaming: true has no effect: Gym reads and tokenizes every row before training starts.")
    train_examples = _collect(data_args.dataset, data_args, kind, seed, media=media is not None,
                              refuse_media=refuse_media)
    _require_tools(train_examples, chat)
    if packing and any(ex.has_media() for ex in train_examples):
        raise DataError(f"{next(ex for ex in train_examples if ex.has_media()).source} has media, and packing "
                        "cannot take it: a packed row's media features would have to be split back per example "
                        "(and Qwen-VL's 3-D positions restarted), which Gym does not do. Set packing: false.")
    train, dropped = _encode_all(train_examples, chat, data_args, kind, media)
    if not train:
        raise DataError(
            f"No training examples left: all {len(train_examples)} rows were dropped: {_NOTHING_FITS[kind]} within "
            f"cutoff_len={data_args.cutoff_len} tokens. Raise cutoff_len or shorten the prompts."
        )
    if dropped:
        logger.warning("Dropped %d of %d examples: %s within cutoff_len=%d.",
                       dropped, len(train_examples), _NOTHING_FITS[kind], data_args.cutoff_len)
    evaluation = None
    if data_args.eval_dataset:
        eval_examples = _collect(data_args.eval_dataset, data_args, kind, seed, media=media is not None,
                                 refuse_media=refuse_media)
        evaluation, eval_dropped = _encode_all(eval_examples, chat, data_args, kind, media)
        if not evaluation:  # an empty evaluation set fails (or reports nothing) only once training has run
            raise DataError(f"No evaluation examples left: all {len(eval_examples)} rows of eval_dataset "
                            f"'{data_args.eval_dataset}' were dropped: {_NOTHING_FITS[kind]} within "
                            f"cutoff_len={data_args.cutoff_len} tokens. Raise cutoff_len or shorten the prompts.")
        if eval_dropped:
            logger.warning("Dropped %d of %d evaluation examples: %s within cutoff_len=%d.", eval_dropped,
                           len(eval_examples), _NOTHING_FITS[kind], data_args.cutoff_len)
    elif data_args.val_size:
        order = list(range(len(train)))
        random.Random(seed).shuffle(order)
        n_eval = int(data_args.val_size) if data_args.val_size >= 1 else max(1, round(len(train) * data_args.val_size))
        if n_eval >= len(train):
            raise DataError(f"val_size={data_args.val_size} leaves no training rows out of {len(train)}.")
        held = set(order[:n_eval])
        evaluation = [train[i] for i in sorted(held)]
        train = [train[i] for i in range(len(train)) if i not in held]
    stats = {"rows": len(train_examples), "dropped": dropped, "examples": len(train), **_token_stats(train)}
    if packing and kind in ("unsupervised", "supervised"):
        train = pack(train, data_args.cutoff_len)
        if evaluation:
            evaluation = pack(evaluation, data_args.cutoff_len)
        stats["packed_rows"] = len(train)
    return TokenizedData(train=train, eval=evaluation, stats=stats)
