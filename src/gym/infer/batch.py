"""`gym infer`: generate an answer for every row of a dataset, in batches, into a JSON-lines file.

Each row's conversation (without its last answer) is rendered with the model's own chat format, as
`gym chat` does, and answered through the same engine as chat and the API (so `infer_backend: vllm`
works here too): up to `batch_size` rows decode together, the next row joining as soon as one
finishes. The line holds the row's index, the messages, the prediction and the reference answer (the
row's last assistant turn, or its `answer` column). The run is resumable: rows whose index is already
in the output file are skipped, and a line cut off by a crash is dropped first. Row i samples with
seed + i, so its answer does not depend on which rows shared its batch.

Rows with images (LLaMA-Factory's mllm datasets: an `images` column and `<image>` in the text) are answered with
their images by a vision-language model (gym.infer.vision_engine: one row at a time, not batched); the line
then also lists the row's images. A text model given such a dataset is refused before the first row.
"""

from __future__ import annotations

import json
import logging
import os
from collections import deque
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from gym.config.files import Config
from gym.core.errors import DataError
from gym.core.files import OutputLock, refuse_file_in_path, remove_stale_temps, temp_path
from gym.core.kinds import DataKind
from gym.data.formats import Example
from gym.data.loader import load_examples
from gym.data.registry import get_dataset_attrs
from gym.infer.chat import ChatModel, ChatTurn
from gym.infer.requests import Finished, Request
from gym.infer.tool_choice import RequestFieldError

logger = logging.getLogger(__name__)


def load_rows(dataset: str, dataset_dir: str, max_samples: int | None) -> list[dict[str, Any]]:
    """[{"messages", "system", "reference", "images"}] for every row: the prompt conversation, its reference and its
    images (checked paths or data: URLs; empty for a text row)."""
    rows = []
    for attr in get_dataset_attrs(dataset, dataset_dir):
        split: list[tuple[Example, list[dict[str, str]], str | None]]
        try:
            # Media are read and checked here; whether the model takes them is known once it loads (_answer_rows).
            examples = load_examples(attr, DataKind.SUPERVISED, max_samples, media=True)
            split = [(e, e.messages[:-1], e.messages[-1]["content"]) for e in examples]
        except DataError:  # prompt-only data: the conversation ends with the user, the answer is a column
            examples = load_examples(attr, DataKind.PROMPT, max_samples, media=True)
            split = [(e, e.messages, e.answer) for e in examples]
        rows += [{"messages": messages, "system": e.system, "reference": reference, "images": list(e.images)}
                 for e, messages, reference in split]
    if not rows:
        raise DataError(f"Dataset '{dataset}' has no rows to answer.")
    return rows


def _done_indices(path: Path, rows: list[dict[str, Any]]) -> set[int]:
    """Indices already answered; the last line, cut off mid-write by an interrupted run, is removed from the file.
    A file that is not an earlier run's output (any other line that is not one of its rows) is refused untouched:
    resuming would have deleted every line of it. So is the output of another dataset: a row is known by its index
    alone, so resuming would have kept that dataset's answers as this one's."""
    if not path.is_file():
        return set()
    try:
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        raise DataError(f"-o {path} exists and is not a gym infer output (not text); choose another file.") from None
    done, kept = set(), []
    for number, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
            index = int(row["index"])
            if "prediction" not in row:
                raise KeyError("prediction")
            kept.append(line if line.endswith("\n") else line + "\n")
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            # only the last line, unended, and begun as this command begins its rows, is one cut off mid-write
            if number != len(lines) or line.endswith("\n") or not line.startswith('{"index": '):
                raise DataError(f"-o {path} exists and line {number} is not a gym infer row ({{index, prediction, "
                                "...}}): it is not an earlier run's output to resume. Choose another file, or move "
                                "this one away.") from None
            logger.warning("Dropping an incomplete line from %s (an interrupted run).", path)
            continue
        # A row past the end is one a run with a larger --max_samples answered: kept, and not asked again.
        if 0 <= index < len(rows) and row.get("messages") != rows[index]["messages"]:
            raise DataError(f"-o {path} answers another dataset: line {number} (row {index}) asks something else than "
                            f"this dataset's row {index}, and resuming would keep its answers as this one's. Choose "
                            "another file, or move this one away.")
        done.add(index)
    if len(kept) != len(lines) or (lines and not lines[-1].endswith("\n")):
        tmp = temp_path(path)
        tmp.write_text("".join(kept), encoding="utf-8")
        os.replace(tmp, path)
    return done


def final_text(request: Request) -> str:
    """The whole answer of a request, once it has finished."""
    *_, last = request.events()
    assert isinstance(last, Finished)
    return last.text


def run_infer(config: Config, dataset: str, output: str | os.PathLike[str], dataset_dir: str = "data",
              batch_size: int = 8, max_samples: int | None = None, seed: int = 42, progress: bool = True) -> Path:
    if batch_size < 1:
        raise DataError(f"--batch_size must be at least 1, got {batch_size}.")
    if max_samples is not None and max_samples < 1:  # else refused as a dataset "with no rows", which it has
        raise DataError(f"--max_samples must be at least 1 (or left out, for every row), got {max_samples}.")
    rows = load_rows(dataset, dataset_dir, max_samples)  # data errors before the model loads
    output = Path(output)
    if output.is_dir():
        raise DataError(f"-o {output} is a folder; gym infer writes one JSONL file: name a file.")
    refuse_file_in_path(output)  # -o under a file: one line now, not mkdir's traceback after the rows are read
    _done_indices(output, rows)  # a file that is not this command's output is refused before the model loads
    output.parent.mkdir(parents=True, exist_ok=True)
    with OutputLock(output, what="gym infer", file=True):  # two runs appending to one file would mix lines
        remove_stale_temps(output.parent)
        return _answer_rows(config, rows, output, batch_size, seed, progress)


def _answer_rows(config: Config, rows: list[dict[str, Any]], output: Path, batch_size: int, seed: int,
                 progress: bool) -> Path:
    done = _done_indices(output, rows)
    todo = [i for i in range(len(rows)) if i not in done]
    if done:
        logger.info("Resuming: %d of %d rows already answered in %s.", len(rows) - len(todo), len(rows), output)
    if not todo:
        return output
    # More rows than are left never decode together; the engine sizes its cache by max_batch_size, so
    # --batch_size 99999999999 on five rows asked for petabytes instead of answering them.
    batch_size = min(batch_size, len(todo))
    model = ChatModel(config, max_batch_size=batch_size, max_waiting=2 * batch_size)
    if model.media is None and any(rows[i]["images"] for i in todo):
        model.close()
        raise DataError(f"The dataset's rows have images but the model is a text model ({model.model_path}); "
                        "answer them with a vision-language model.")
    bar = tqdm(total=len(rows), initial=len(rows) - len(todo), desc="infer", disable=not progress, dynamic_ncols=True)
    pending: deque[tuple[int, Request]] = deque()
    try:
        with output.open("a", encoding="utf-8") as handle:
            for position in range(len(todo) + 2 * batch_size):
                # Keep two batches' worth in flight, so a row can join the moment another finishes.
                if position < len(todo):
                    i = todo[position]
                    params = model.sampling_params(seed=seed + i)
                    if rows[i]["images"]:
                        turn = _turn(model, rows[i], i)
                        pending.append((i, model.engine.submit(turn.prompt, params, media=turn.media)))
                    else:
                        prompt = model.render(rows[i]["messages"], rows[i]["system"])
                        pending.append((i, model.engine.submit(prompt, params)))
                if pending and (len(pending) >= 2 * batch_size or position >= len(todo)):
                    i, request = pending.popleft()
                    line = {"index": i, "messages": rows[i]["messages"], "prediction": final_text(request).strip(),
                            "reference": rows[i]["reference"]}
                    if rows[i]["images"]:
                        line["images"] = rows[i]["images"]
                    handle.write(json.dumps(line, ensure_ascii=False) + "\n")
                    handle.flush()
                    bar.update(1)
    finally:
        bar.close()
        model.close()
    return output


def _turn(model: ChatModel, row: dict[str, Any], index: int) -> ChatTurn:
    """A row with images -> its prompt and media tensors; a problem (placeholders that do not match the images)
    names the row."""
    try:
        return model.prepare(row["messages"], row["system"], images=row["images"])
    except RequestFieldError as e:
        raise DataError(f"row {index}: {e}") from None
