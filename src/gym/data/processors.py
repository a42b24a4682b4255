"""Examples -> token ids and labels, one function per data kind.

Prompt and answer pieces are rendered by the chat format and tokenized separately, exactly as in
sft, so every stage sees a conversation the way it is served.

Labels are -100 wherever no loss is wanted: prompts (tool results included, unless `train_on_prompt`), earlier answers
with `mask_history`, and the first token of every example, so that packed examples never learn to
predict across their boundary.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from gym.core.errors import DataError
from gym.data.formats import Example
from gym.data.media import PLACEHOLDERS
from gym.data.messages import OBSERVATION, USER, Message
from gym.data.multimodal import MediaInputs, RowTokenizer, media_fields
from gym.data.templates import ChatFormat

IGNORE_INDEX = -100


def _ends_turn(ids: list[int], special_ids: set[int]) -> bool:
    # Templates end an answer with an end-of-turn token, sometimes followed by a newline.
    return any(t in special_ids for t in ids[-3:])


def encode_supervised(example: Example, chat: ChatFormat, cutoff_len: int, train_on_prompt: bool = False,
                      mask_history: bool = False, media: MediaInputs | None = None) -> dict[str, Any] | None:
    """A conversation -> {"input_ids", "labels"}, or None when truncation leaves nothing to learn.

    With `media` (a multimodal model), pieces holding placeholders are tokenized by the model's processor, the
    row keeps its media items for the collator, and no label covers a media token."""
    tokenizer = chat.tokenizer
    special_ids = set(tokenizer.all_special_ids)
    pairs = chat.render_pairs(example.messages, example.system, example.tools)
    row_tokenizer = RowTokenizer(media, example) if media is not None and example.has_media() else None
    tokenize = row_tokenizer or (lambda text: tokenizer.encode(text, add_special_tokens=False))
    input_ids: list[int] = []
    labels: list[int] = []
    prompt_ids: list[int] = []
    response_ids: list[int] = []
    for turn, (prompt, response) in enumerate(pairs):
        prompt_ids = tokenize(prompt)
        response_ids = tokenize(response)
        if not _ends_turn(response_ids, special_ids) and tokenizer.eos_token_id is not None:
            response_ids.append(tokenizer.eos_token_id)
        learn_response = not mask_history or turn == len(pairs) - 1
        input_ids += prompt_ids + response_ids
        labels += (prompt_ids if train_on_prompt else [IGNORE_INDEX] * len(prompt_ids))
        labels += response_ids if learn_response else [IGNORE_INDEX] * len(response_ids)
    start, end = 0, min(len(input_ids), cutoff_len)
    if mask_history and len(input_ids) > cutoff_len:
        # Cutting the end would cut the one answer mask_history learns and drop the row. As in LLaMA-Factory, the
        # last turn gets the room first and earlier turns take what is left; unlike it, the row is one unbroken
        # stretch ending at the answer, so the answer still follows its assistant header as when served.
        kept = _answer_room(len(prompt_ids), len(response_ids), cutoff_len)
        end = len(input_ids) - len(response_ids) + kept
        start = max(0, end - cutoff_len)
    row: dict[str, Any] = {}
    if row_tokenizer is not None and media is not None:
        if any(t in media.media_ids for t in input_ids[:start] + input_ids[end:]):
            raise DataError(f"{example.source}: cutoff_len={cutoff_len} would cut through the row's media tokens "
                            f"(the row takes {len(input_ids)} tokens with its media expanded); raise cutoff_len.")
        labels = [IGNORE_INDEX if t in media.media_ids else label for t, label in zip(input_ids, labels)]
        row_tokenizer.finish()
        row.update(media_fields(example))
    input_ids, labels = input_ids[start:end], labels[start:end]
    labels[0] = IGNORE_INDEX
    if all(label == IGNORE_INDEX for label in labels):
        return None
    return {"input_ids": input_ids, "labels": labels, **row}


def _answer_room(prompt_len: int, answer_len: int, cutoff_len: int) -> int:
    """How many tokens of a turn's answer fit in cutoff_len beside its prompt (LLaMA-Factory's infer_seqlen): a
    short answer whole; a long one after a short prompt, what the prompt leaves; otherwise each its share."""
    if 2 * answer_len < cutoff_len:
        return answer_len
    if 2 * prompt_len < cutoff_len:
        return min(answer_len, cutoff_len - prompt_len)
    return min(answer_len, cutoff_len * answer_len // (prompt_len + answer_len))


def encode_unsupervised(example: Example, chat: ChatFormat, cutoff_len: int, **_: Any) -> list[dict[str, list[int]]]:
    """Plain text -> chunks of at most cutoff_len tokens, each ending the document with EOS."""
    tokenizer = chat.tokenizer
    text = "\n\n".join(m["content"] for m in example.messages if m["content"])
    ids = tokenizer.encode(text, add_special_tokens=True)
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    chunks = []
    for start in range(0, len(ids), cutoff_len):
        chunk = ids[start : start + cutoff_len]
        if len(chunk) < 2:
            continue
        chunks.append({"input_ids": chunk, "labels": [IGNORE_INDEX] + chunk[1:]})
    return chunks


def _answer_ids(chat: ChatFormat, response: str) -> list[int]:
    tokenizer = chat.tokenizer
    ids: list[int] = tokenizer.encode(response, add_special_tokens=False)
    if not _ends_turn(ids, set(tokenizer.all_special_ids)) and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return ids


def _render_prompt_and_answer(example: Example, chat: ChatFormat, answer: str | Message) -> tuple[str, str]:
    """The conversation so far (ending with the assistant header) and `answer` (text, or an assistant message that
    may call tools) as its next turn, rendered."""
    if isinstance(answer, str):
        answer = {"role": "assistant", "content": answer}
    pairs = chat.render_pairs([*example.messages, answer], example.system,
                              example.tools)
    return "".join(p + r for p, r in pairs[:-1]) + pairs[-1][0], pairs[-1][1]


def _prompt_and_answer(example: Example, chat: ChatFormat, answer: str | Message) -> tuple[list[int], list[int]]:
    prompt, response = _render_prompt_and_answer(example, chat, answer)
    return chat.tokenizer.encode(prompt, add_special_tokens=False), _answer_ids(chat, response)


def _media_prompt_ids(example: Example, prompt: str, media: MediaInputs) -> list[int]:
    """A rendered prompt holding every one of the row's placeholders -> its ids, media expanded by the processor."""
    row_tokenizer = RowTokenizer(media, example)
    ids = row_tokenizer(prompt)
    row_tokenizer.finish()
    return ids


def _text_answer_ids(example: Example, chat: ChatFormat, response: str, media: MediaInputs, which: str) -> list[int]:
    """An answer of a preference row, which is text: a placeholder or media token in it would have no pixels behind
    it (the media are the prompt's), and the model would refuse the batch mid-training."""
    ids = _answer_ids(chat, response)
    if any(tag in response for tag in PLACEHOLDERS.values()) or media.media_ids.intersection(ids):
        raise DataError(f"{example.source}: the {which} answer holds a media placeholder; in preference data the "
                        "images, videos and audio go in the prompt, and the answers are text.")
    return ids


def encode_pairwise(example: Example, chat: ChatFormat, cutoff_len: int, media: MediaInputs | None = None,
                    **_: Any) -> dict[str, Any] | None:
    """A prompt with a chosen and a rejected answer -> {"prompt_ids", "chosen_ids", "rejected_ids"}.

    Answers are cut to fit cutoff_len after the prompt; None when the prompt alone fills it. With `media` (a
    multimodal model), the prompt's placeholders are expanded by the processor and the row keeps its media items
    for the collator; the answers stay text.
    """
    if example.chosen is None or example.rejected is None:
        raise DataError(f"{example.source}: a pairwise example needs both a chosen and a rejected answer.")
    if media is None or not example.has_media():
        prompt_ids, chosen_ids = _prompt_and_answer(example, chat, example.chosen)
        rejected_ids = _prompt_and_answer(example, chat, example.rejected)[1]
        row: dict[str, Any] = {}
    else:
        prompt, chosen = _render_prompt_and_answer(example, chat, example.chosen)
        rejected = _render_prompt_and_answer(example, chat, example.rejected)[1]
        chosen_ids = _text_answer_ids(example, chat, chosen, media, "chosen")
        rejected_ids = _text_answer_ids(example, chat, rejected, media, "rejected")
        prompt_ids = _media_prompt_ids(example, prompt, media)
        row = media_fields(example)
    room = cutoff_len - len(prompt_ids)
    if room < 1:
        return None
    return {"prompt_ids": prompt_ids, "chosen_ids": chosen_ids[:room], "rejected_ids": rejected_ids[:room], **row}


def encode_feedback(example: Example, chat: ChatFormat, cutoff_len: int, media: MediaInputs | None = None,
                    **_: Any) -> dict[str, Any] | None:
    """A conversation whose last answer is tagged desirable or not -> {"prompt_ids", "completion_ids", "label"}
    (+ the row's media items with `media`, as in encode_pairwise: the placeholders belong to the prompt)."""
    history = dataclasses.replace(example, messages=example.messages[:-1])  # the media stay with the prompt
    row: dict[str, Any] = {}
    if media is None or not example.has_media():
        prompt_ids, completion_ids = _prompt_and_answer(history, chat, example.messages[-1])
    else:
        prompt, answer = _render_prompt_and_answer(history, chat, example.messages[-1])
        completion_ids = _text_answer_ids(example, chat, answer, media, "tagged")
        prompt_ids = _media_prompt_ids(history, prompt, media)
        row = media_fields(example)
    room = cutoff_len - len(prompt_ids)
    if room < 1:
        return None
    return {"prompt_ids": prompt_ids, "completion_ids": completion_ids[:room], "label": bool(example.kto_tag), **row}


def encode_prompt(example: Example, chat: ChatFormat, cutoff_len: int, **_: Any) -> dict[str, Any] | None:
    """A conversation ending with a user turn -> {"prompt" (text), "prompt_ids"} (+ "answer" when known).

    Online methods generate the answer themselves, so a prompt that fills cutoff_len leaves no room
    and the example is dropped.
    """
    prompt = chat.render_prompt(example.messages, example.system, example.tools)
    prompt_ids = chat.tokenizer.encode(prompt, add_special_tokens=False)
    if len(prompt_ids) >= cutoff_len:
        return None
    row: dict[str, Any] = {"prompt": prompt, "prompt_ids": prompt_ids}
    if example.answer is not None:
        row["answer"] = example.answer
    return row


def classifier_text(chat: ChatFormat, messages: Sequence[Message], system: str | None = None,
                    tools: list[dict[str, Any]] | None = None) -> str:
    """The text a sequence classifier (stage: cls) reads for a conversation: the conversation as the chat format
    serves it. One ending with a user (or tool) turn is the prompt that asks for the next answer (`render_prompt`,
    the assistant header included); one ending with an answer is every turn, each closed by its end-of-turn. A
    `text` or instruction row is one user turn. Whatever serves the classifier renders with this function too."""
    if messages and messages[-1]["role"] in (USER, OBSERVATION):
        return chat.render_prompt(messages, system, tools)
    return "".join(prompt + answer for prompt, answer in chat.render_pairs(messages, system, tools))


def encode_labelled(example: Example, chat: ChatFormat, cutoff_len: int, **_: Any) -> dict[str, Any]:
    """A conversation with a class -> {"input_ids", "label" (as the row gives it), "source"}. The label becomes a
    class index once every row is read (class_names). A text over cutoff_len keeps its last cutoff_len tokens: the
    classifier reads the last one, and a guard cares most about the latest turn."""
    if example.label is None:
        raise DataError(f"{example.source}: a labelled example needs a label.")
    text = classifier_text(chat, example.messages, example.system, example.tools)
    ids = chat.tokenizer.encode(text, add_special_tokens=False)
    return {"input_ids": ids[-cutoff_len:], "label": example.label, "source": example.source}


def class_names(rows: Sequence[Mapping[str, Any]], given: Sequence[str] | None = None) -> list[str]:
    """The classes of encoded labelled rows, in index order: `given` (the stage's `labels`), else the distinct names
    the rows use, sorted (rows that give indices: "0" up to the largest). A row whose label is not one of `given`, or
    data that mixes names and indices without `given`, is a DataError naming the row."""
    if given is not None:
        for row in rows:
            label = row["label"]
            if (label not in given) if isinstance(label, str) else not label < len(given):
                raise DataError(f"{row['source']}: label {label!r} is not one of labels: {list(given)}; add it to "
                                "`labels` (the classes, in order) or fix the row.")
        return list(given)
    named = [row for row in rows if isinstance(row["label"], str)]
    if named and len(named) < len(rows):
        indexed = next(row for row in rows if not isinstance(row["label"], str))
        raise DataError(f"{indexed['source']}: label {indexed['label']!r} is an index, while {named[0]['source']} "
                        f"names its class ({named[0]['label']!r}); set `labels` (the class names, in index order) "
                        "or give every row a name.")
    names = (sorted({row["label"] for row in rows}) if named
             else [str(i) for i in range(max(row["label"] for row in rows) + 1)])
    if len(names) < 2:
        raise DataError(f"The labelled data has a single class ({names[0]!r}): a classifier needs rows of at least "
                        "two classes. Add rows of the other classes, or list them in `labels`.")
    return names


def class_index(label: str | int, names: Sequence[str]) -> int:
    """A row's label (a name, or an index already) -> its class index in `names` (checked by class_names)."""
    return names.index(label) if isinstance(label, str) else label
