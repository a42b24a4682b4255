"""`gym api` as a process: an adapter trained by `gym train` is served with its training template,
and SIGTERM shuts the server down cleanly while a request is streaming."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import openai
from tests.conftest import free_port

from gym.cli import main
from gym.data.formats import Example
from gym.data.processors import encode_supervised
from gym.data.templates import get_chat_format
from gym.infer.chat import ChatModel

QUESTION = [{"role": "user", "content": "Add 2 and 3."}]


def training_prompt_ids(tokenizer) -> list[int]:
    """The prompt ids the trainer saw for QUESTION: everything before the first supervised label."""
    ids = encode_supervised(Example("t", QUESTION + [{"role": "assistant", "content": "5"}]),
                            get_chat_format(tokenizer, "llama3", "Answer briefly."), cutoff_len=512)
    first_label = next(i for i, label in enumerate(ids["labels"]) if label != -100)
    return ids["input_ids"][:first_label]


def post(url: str, body: dict, key: str) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_trained_adapter_through_gym_chat_and_gym_api_with_its_template_then_sigterm(trained_run, tokenizer,
                                                                                     capsys):
    adapter = str(trained_run)
    expected = training_prompt_ids(tokenizer)

    # gym chat: the CLI's ChatModel renders the training prompt, and answers once with --prompt.
    assert ChatModel({"adapter_name_or_path": str(adapter)}).render(QUESTION) == expected
    assert main(["chat", "--adapter_name_or_path", str(adapter), "--prompt", "Add 2 and 3.",
                 "--max_new_tokens", "3"]) == 0
    assert "User: Add 2 and 3.\nAssistant: " in capsys.readouterr().out

    # gym api, as its own process: the same ids, then a clean exit on SIGTERM mid-stream.
    port, key = free_port(), "k3y"
    server = subprocess.Popen([sys.executable, "-m", "gym.cli", "api", "--adapter_name_or_path", str(adapter),
                               "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "HF_HUB_OFFLINE": "1", "GYM_API_KEY": key})
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while True:
            assert server.poll() is None, server.stdout.read()
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                assert time.time() < deadline, "gym api did not come up"
                time.sleep(0.2)
        name = Path(adapter).name
        assert post(f"{url}/tokenize", {"model": name, "messages": QUESTION}, key)["tokens"] == expected
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
        answer = client.chat.completions.create(model=name, messages=QUESTION, max_tokens=3, temperature=0)
        assert answer.usage.prompt_tokens == len(expected)

        streamed: list[str] = []

        def stream() -> None:
            for chunk in client.chat.completions.create(model=name, messages=QUESTION, max_tokens=300, stream=True):
                streamed.append(chunk.choices[0].finish_reason or "") if chunk.choices else None

        reader = threading.Thread(target=stream)
        reader.start()
        while not streamed:
            time.sleep(0.05)
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0
        reader.join(30)
        assert not reader.is_alive() and streamed[-1] in ("length", "stop")  # the request in flight finished
    finally:
        if server.poll() is None:
            server.kill()
    log = server.stdout.read()
    assert "Shutting down" in log and "Traceback" not in log


def test_gym_api_errors_are_one_line_exit_2(capsys, tiny_model_dir):
    assert main(["api", "--model_name_or_path", str(tiny_model_dir), "--port", "eighty"]) == 2
    assert "whole numbers" in capsys.readouterr().err
    assert main(["api", "--model_name_or_path", str(tiny_model_dir), "--infer_backend", "vllm"]) == 2
    assert "pip install vllm" in capsys.readouterr().err
