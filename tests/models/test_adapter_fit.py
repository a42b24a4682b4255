"""An adapter trained on a base of another size is one line naming the tensor and the base it was trained on, exit 2,
from every door that loads one (issue #39's leftover: chat, eval and infer ended in peft's traceback)."""

from __future__ import annotations

import pytest
from tests.gym_cli import assert_one_line_error, gym_here


@pytest.mark.parametrize("verb", [
    ["chat", "--prompt", "Hi"],
    ["eval", "--task", "ppl:tiny_text"],
    ["infer", "--dataset", "tiny_alpaca"],
])
def test_an_adapter_for_another_base_is_one_line_from_every_door(verb, narrow_adapter, tiny_model_dir, data_dir,
                                                                  tmp_path):
    args = [verb[0], "--model_name_or_path", str(tiny_model_dir), "--adapter_name_or_path", str(narrow_adapter),
            "--dataset_dir", str(data_dir), *verb[1:]]
    if verb[0] in ("eval", "infer"):
        args += ["-o", str(tmp_path / "out.json")]
    assert_one_line_error(gym_here(*args), f"The adapter {narrow_adapter} does not fit the base {tiny_model_dir} "
                          "(size mismatch for", "It was trained on")
    assert not (tmp_path / "out.json").exists()
