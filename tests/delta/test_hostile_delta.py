"""`gym delta apply -o` over its own inputs (issue #39): an output folder that is the base, or holds the base or the
delta, is refused --overwrite or not, and --overwrite replaces only a model folder Gym wrote; inputs and the user's
files are left exactly as they were."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tests.gym_cli import assert_one_line_error, gym_here


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture()
def work(gaussian_finetune, tiny_model_dir, tmp_path) -> dict[str, Path]:
    """work/base (a copy of the tiny base) and work/d.safetensors (an int8 delta of a fine-tune of it)."""
    root = tmp_path / "work"
    shutil.copytree(tiny_model_dir, root / "base")
    assert gym_here("delta", "compress", "--base", root / "base", "--finetuned", gaussian_finetune, "--method", "int8",
                    "-o", root / "d.safetensors").returncode == 0
    return {"root": root, "base": root / "base", "delta": root / "d.safetensors"}


def test_apply_never_writes_over_its_base_or_delta(work):
    before = _snapshot(work["root"])
    for out, where, source in ((work["base"], "is", work["base"]), (work["root"], "holds", work["base"])):
        done = gym_here("delta", "apply", "--base", work["base"], "--delta", work["delta"], "-o", out, "--overwrite")
        assert_one_line_error(done, f"gym: error: The output {out} {where} the input {source}")
    assert _snapshot(work["root"]) == before


def test_apply_overwrites_only_a_model_folder_gym_wrote(work, tmp_path):
    out = tmp_path / "applied"
    args = ["delta", "apply", "--base", work["base"], "--delta", work["delta"], "-o", out]
    assert gym_here(*args).returncode == 0
    assert gym_here(*args, "--overwrite").returncode == 0
    (out / "eval-notes.txt").write_text("mine")
    before = _snapshot(out)
    done = gym_here(*args, "--overwrite")
    assert_one_line_error(done, "holds eval-notes.txt, which Gym did not write there")
    assert _snapshot(out) == before
