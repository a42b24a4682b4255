"""Fixtures for gym.eval: the tiny model loaded as an EvalModel, and a small multiple-choice dataset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_eval_model(tiny_model_dir):
    from gym.eval.model import load_eval_model

    model = load_eval_model({"model_name_or_path": str(tiny_model_dir)})
    yield model
    model.close()


@pytest.fixture()
def mc_dir(tmp_path) -> Path:
    """Eight questions over two subjects (one per file, MMLU's layout: A-D columns, a letter answer), and a
    dev file of shots."""
    rows = {
        "colors_test": [("What color is the sky on a clear day?", ["green", "blue", "red", "black"], "B"),
                        ("What color is grass?", ["green", "purple", "white", "orange"], "A"),
                        ("What color is snow?", ["brown", "yellow", "white", "blue"], "C"),
                        ("What color is a ripe banana?", ["blue", "black", "pink", "yellow"], "D")],
        "numbers_test": [("What is 2 + 2?", ["3", "4", "5", "6"], "B"), ("What is 3 x 3?", ["9", "6", "12", "8"], "A"),
                         ("What is 10 - 7?", ["1", "2", "3", "4"], "C"), ("What is 6 / 2?", ["2", "4", "5", "3"], "D")],
    }
    folder = tmp_path / "mc"
    folder.mkdir()
    for name, items in rows.items():
        data = [{"question": q, **dict(zip("ABCD", choices)), "answer": a} for q, choices, a in items]
        (folder / f"{name}.json").write_text(json.dumps(data))
    dev = [{"subject": s, "question": f"Example {i} about {s}?", "choices": ["w", "x", "y", "z"], "answer": i % 4}
           for s in ("colors", "numbers") for i in range(3)]
    (tmp_path / "mc_dev.json").write_text(json.dumps(dev))
    (tmp_path / "dataset_info.json").write_text(json.dumps({
        "quiz": {"file_name": "mc"}, "quiz_dev": {"file_name": "mc_dev.json"}}))
    return tmp_path
