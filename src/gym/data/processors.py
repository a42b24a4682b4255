"""Examples -> token ids and labels, one function per data kind.

Labels are -100 wherever no loss is wanted: prompts (unless `train_on_prompt`), earlier answers
with `mask_history`, and the first token of every example, so that packed examples never learn to
predict across their boundary.
"""

from __future__ import annotations

from typing import Any

from gym.data.formats import Example
from gym.data.templates import ChatFormat

IGNORE_INDEX = -100


def _ends_turn(ids: list[int], special_ids: set[int]) -> bool:
    # Templates end an answer with an end-of-turn token, sometimes followed by a newline.
    return any(t in special_ids for t in ids[-3:])


def encode_supervised(example: Example, chat: ChatFormat, cutoff_len: int, train_on_prompt: bool = False,
                      mask_history: bool = False) -> dict[str, list[int]] | None:
    """A conversation -> {"input_ids", "labels"}, or None when truncation leaves nothing to learn."""
    tokenizer = chat.tokenizer
    special_ids = set(tokenizer.all_special_ids)
    pairs = chat.render_pairs(example.messages, example.system)
    input_ids: list[int] = []
    labels: list[int] = []
    for turn, (prompt, response) in enumerate(pairs):
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        response_ids = tokenizer.encode(response, add_special_tokens=False)
        if not _ends_turn(response_ids, special_ids) and tokenizer.eos_token_id is not None:
            response_ids.append(tokenizer.eos_token_id)
        learn_response = not mask_history or turn == len(pairs) - 1
        input_ids += prompt_ids + response_ids
        labels += (prompt_ids if train_on_prompt else [IGNORE_INDEX] * len(prompt_ids))
        labels += response_ids if learn_response else [IGNORE_INDEX] * len(response_ids)
    input_ids, labels = input_ids[:cutoff_len], labels[:cutoff_len]
    labels[0] = IGNORE_INDEX
    if all(label == IGNORE_INDEX for label in labels):
        return None
    return {"input_ids": input_ids, "labels": labels}


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
