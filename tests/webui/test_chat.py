"""The Chat tab's playground loads what `gym chat` loads (a base, a run's output folder) and answers with the
same model: a run's adapter answers as `gym chat` on that run does."""

from __future__ import annotations

import pytest

from gym.core.errors import GymError
from gym.infer.chat import ChatModel
from gym.webui.tab_chat import Playground


def test_a_runs_output_answers_as_gym_chat_on_it(trained_run):
    output = str(trained_run)
    playground = Playground()
    try:
        assert "Loaded" in playground.load(output, "", "", "", "")
        question = [{"role": "user", "content": "Add 2 and 3."}]
        got = playground.model.chat(question, max_new_tokens=8, do_sample=False)
        reference = ChatModel({"output_dir": output})
        try:
            assert got == reference.chat(question, max_new_tokens=8, do_sample=False)
        finally:
            reference.close()
        assert playground.model.model_args.adapter_name_or_path == output  # the adapter, on its base
    finally:
        playground.unload()
    assert playground.model is None


def test_loading_nothing_is_a_clear_error():
    with pytest.raises(GymError, match="Pick a model"):
        Playground().load("", "", "", "", "")
