"""`gym infer`: generate an answer for every row of a dataset, in batches, into a JSON-lines file.

Each row's conversation (without its last answer) is rendered with the model's own chat format, as
`gym chat` does, and answered; the line holds the row's index, the messages, the prediction and the
reference answer (the row's last assistant turn, or its `answer` column). Prompts in a batch are
left-padded so that every prompt ends where generation begins. The run is resumable: rows whose index
is already in the output file are skipped, and a line cut off by a crash is dropped first. Each batch
is seeded from its first row's index, so a run is reproducible.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from gym.chat import ChatModel
from gym.errors import DataError

logger = logging.getLogger(__name__)


def load_rows(dataset: str, dataset_dir: str, max_samples: int | None) -> list[dict[str, Any]]:
    """[{"messages", "system", "reference"}] for every row: the prompt conversation and its reference."""
    from gym.data.loader import load_examples
    from gym.data.registry import get_dataset_attrs

    rows = []
    for attr in get_dataset_attrs(dataset, dataset_dir):
        try:
            examples = load_examples(attr, "supervised", max_samples)
            split = [(e, e.messages[:-1], e.messages[-1]["content"]) for e in examples]
        except DataError:  # prompt-only data: the conversation ends with the user, the answer is a column
            examples = load_examples(attr, "prompt", max_samples)
            split = [(e, e.messages, e.answer) for e in examples]
        rows += [{"messages": messages, "system": e.system, "reference": reference} for e, messages, reference in split]
    if not rows:
        raise DataError(f"Dataset '{dataset}' has no rows to answer.")
    return rows


def _done_indices(path: Path) -> set[int]:
    """Indices already answered; a last line cut off mid-write is removed from the file."""
    if not path.is_file():
        return set()
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    done, kept = set(), []
    for line in lines:
        try:
            done.add(int(json.loads(line)["index"]))
            kept.append(line if line.endswith("\n") else line + "\n")
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            logger.warning("Dropping an incomplete line from %s (an interrupted run).", path)
    if len(kept) != len(lines) or (lines and not lines[-1].endswith("\n")):
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text("".join(kept), encoding="utf-8")
        os.replace(tmp, path)
    return done


def generate_batch(model: ChatModel, rows: list[dict[str, Any]], **overrides: Any) -> list[str]:
    """Answers for several conversations in one generate() call (left padding, one attention mask)."""
    prompts = [model.render(r["messages"], r["system"]) for r in rows]
    longest = max(len(p) for p in prompts)
    pad = model.tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (longest - len(p)) + p for p in prompts], device=model.model.device)
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts], device=model.model.device)
    with torch.no_grad():
        out = model.model.generate(input_ids=ids, attention_mask=mask, **model._generate_kwargs(overrides))
    return model.tokenizer.batch_decode(out[:, longest:], skip_special_tokens=True)


def run_infer(config: dict[str, Any], dataset: str, output: str | os.PathLike, dataset_dir: str = "data",
              batch_size: int = 8, max_samples: int | None = None, seed: int = 42, progress: bool = True) -> Path:
    from tqdm.auto import tqdm

    if batch_size < 1:
        raise DataError(f"--batch_size must be at least 1, got {batch_size}.")
    rows = load_rows(dataset, dataset_dir, max_samples)  # data errors before the model loads
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    done = _done_indices(output)
    todo = [i for i in range(len(rows)) if i not in done]
    if done:
        logger.info("Resuming: %d of %d rows already answered in %s.", len(rows) - len(todo), len(rows), output)
    if not todo:
        return output
    model = ChatModel(config)
    bar = tqdm(total=len(rows), initial=len(rows) - len(todo), desc="infer", disable=not progress, dynamic_ncols=True)
    with output.open("a", encoding="utf-8") as handle:
        for start in range(0, len(todo), batch_size):
            batch = todo[start:start + batch_size]
            torch.manual_seed(seed + batch[0])
            answers = generate_batch(model, [rows[i] for i in batch])
            for i, answer in zip(batch, answers):
                line = {"index": i, "messages": rows[i]["messages"], "prediction": answer.strip(),
                        "reference": rows[i]["reference"]}
                handle.write(json.dumps(line, ensure_ascii=False) + "\n")
            handle.flush()
            bar.update(len(batch))
    bar.close()
    return output
