"""`gym api --experiences FILE`: a Training-Free GRPO library in every chat's system prompt; and TF-GRPO's rollouts
through `gym api` itself."""

from __future__ import annotations

import json

import openai
import pytest

from gym.cli import main
from gym.tfgrpo import GRPOConfig, TrainingFreeGRPO
from gym.tfgrpo.library import ExperienceLibrary, with_experiences

from ..tfgrpo.conftest import ScriptedLLM

LIBRARY = ExperienceLibrary(["When adding, line up the digits.", "When unsure, check the last step."], step=4)
HELLO = [{"role": "user", "content": "What is 12 + 30?"}]


@pytest.fixture(scope="module")
def base_url(serve_app, tiny_chat):
    return serve_app(tiny_chat, "tiny", experiences=LIBRARY)


def test_every_chat_prompt_carries_the_library(base_url, tiny_chat):
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0, timeout=60)
    expected = tiny_chat.render(HELLO, with_experiences(None, LIBRARY))
    response = client.chat.completions.create(model="tiny", messages=HELLO, temperature=0, max_tokens=6)
    assert response.usage.prompt_tokens == len(expected)
    reference = tiny_chat.engine.generate(expected, tiny_chat.sampling_params(do_sample=False, max_new_tokens=6))
    assert response.choices[0].message.content == reference.text
    # A client's own system prompt comes first, the library after it.
    system = [{"role": "system", "content": "You are terse."}, *HELLO]
    import urllib.request

    request = urllib.request.Request(f"{base_url}/tokenize", data=json.dumps({"messages": system}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        tokens = json.loads(answer.read())["tokens"]
    assert tokens == tiny_chat.render(HELLO, with_experiences("You are terse.", LIBRARY))
    assert "[1]. When unsure, check the last step." in tiny_chat.tokenizer.decode(tokens)


def test_a_bad_library_file_fails_before_the_model_loads(tmp_path, capsys):
    bad = tmp_path / "experiences.json"
    bad.write_text("[1, 2]")
    assert main(["api", "--model_name_or_path", str(tmp_path / "no-model"), "--experiences", str(bad)]) == 2
    assert "experiences.json: expected" in capsys.readouterr().err


@pytest.mark.slow
def test_tfgrpo_rollouts_through_gym_api(serve_app, tiny_chat, tmp_path):
    """Rollouts from the tiny model served by `gym api` (a real engine, sampled at 0.7), the updater scripted
    (a random tiny model writes no JSON); a length reward gives groups with different scores."""
    url = serve_app(tiny_chat, "tiny")
    updater = ScriptedLLM()
    trainer = TrainingFreeGRPO("tiny", GRPOConfig(base_url=f"{url}/v1", group_size=3, max_epochs=1, batch_size=2,
                                                  max_tokens=8, max_concurrency=6), updater=updater)
    rows = [{"question": f"Count to {n}.", "answer": str(n)} for n in (3, 4, 5, 6)]
    library = trainer.train(rows, "length:4", output_dir=tmp_path / "run")
    assert trainer.usage.roles["rollout"].calls == 12 and trainer.usage.roles["rollout"].completion_tokens > 0
    assert sum(h.partial_groups for h in trainer.history) >= 1
    assert len(library) >= 1 and updater.calls["batch_update"] == len([h for h in trainer.history if h.partial_groups])
    assert ExperienceLibrary.load(tmp_path / "run" / "experiences.json") == library
