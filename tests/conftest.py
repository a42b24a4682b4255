"""Shared fixtures: a tiny Llama built locally around the embedded tokenizer, and small datasets.

Nothing here touches the network: HF_HUB_OFFLINE is forced on for the whole session.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # One pytest worker per core (make test runs `-n 2`): each computes on one thread, and so do the processes its
    # tests start, so two workers never fight over the cores (OpenMP threads spin-wait when oversubscribed).
    os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parent.parent
pytest_plugins = ["tests.thread_guard"]  # no test leaves a thread burning CPU through the later ones


def pytest_sessionstart(session: pytest.Session) -> None:
    """malloc keeps what a test frees for the next, as a training run does for its next step (gym.core.allocator):
    set once here, so every test runs under it, whichever test trains first in a worker."""
    from gym.core.allocator import keep_freed_memory

    keep_freed_memory()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move what collection made (torch, transformers, every test module: ~550k objects) out of the collector's
    reach. A worker runs for the whole suite, and each full collection walked all of it: 27% of the time of
    tests/train/test_sft.py, test_dpo.py, tests/data and tests/config in one process (25.4 of 94.8 s), 8.5 s and
    73.0 s once frozen. Objects the tests make are collected as before; nothing frozen here is garbage."""
    import gc

    gc.collect()
    gc.freeze()


@pytest.fixture(scope="session")
def embedded_dir() -> Path:
    """The embedded SmolLM2 converted into Gym's cache (converted once per machine)."""
    from gym.models.loader import resolve_model_path

    return Path(resolve_model_path("smollm2-135m"))


@pytest.fixture(scope="session")
def tokenizer(embedded_dir):
    from gym.models.loader import load_tokenizer

    return load_tokenizer(str(embedded_dir))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> Path:
    """A 2-layer Llama with the embedded tokenizer: real architecture, trains in well under a second."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    path = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def bitdelta(tiny_model_dir, folder: Path, seed: int) -> Path:
    """A BitDelta of the tiny model nudged by noise of `seed`: a variant that answers unlike the base."""
    import torch
    from transformers import AutoModelForCausalLM

    from gym.delta.bitdelta import BitDeltaConfig, BitDeltaQuantizer

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    tuned = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in tuned.named_parameters():
            param.add_(torch.randn(param.shape, generator=g) * 0.05)
    # Named as `gym delta compress --base` names it: a store checks a variant's shapes against that base.
    return BitDeltaQuantizer(BitDeltaConfig(distill_steps=0)).compress(
        base, tuned, base_name=str(tiny_model_dir), progress=False).save(folder / f"delta-{seed}.safetensors")


def free_port() -> int:
    """A port free on 127.0.0.1 now (for servers the tests start)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def serve_app():
    """serve_app(chat_model, name, api_key, **create_app options) -> the base URL of a live `gym api` app on
    127.0.0.1 (uvicorn in a thread), for the real openai client; all are stopped after the module."""
    import threading
    import time

    import uvicorn

    from gym.serve.app import create_app

    servers = []

    def start(chat_model, name: str = "tiny", api_key: str | None = None, **options) -> str:
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(create_app(chat_model, name, api_key, **options), host="127.0.0.1",
                                               port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.time() + 30
        while not server.started:
            assert thread.is_alive() and time.time() < deadline, "the server did not start"
            time.sleep(0.02)
        servers.append((server, thread))
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(30)


def write_tiny_datasets(folder: Path) -> Path:
    """A dataset_dir with small alpaca, sharegpt and text datasets registered in dataset_info.json."""
    alpaca = [{"instruction": f"Add {i} and {i + 1}.", "input": "", "output": f"{i} + {i + 1} = {2 * i + 1}."}
              for i in range(24)]
    chat = [{"conversations": [{"from": "human", "value": f"Say {w}."}, {"from": "gpt", "value": w},
                               {"from": "human", "value": "Again, louder."}, {"from": "gpt", "value": w.upper()}]}
            for w in ["hello", "tree", "river", "stone", "cloud", "light", "house", "bird"]]
    text = [{"text": f"Document {i}: the number {i} squared is {i * i}."} for i in range(20)]
    (folder / "alpaca.json").write_text(json.dumps(alpaca))
    (folder / "chat.json").write_text(json.dumps(chat))
    (folder / "text.jsonl").write_text("".join(json.dumps(r) + "\n" for r in text))
    (folder / "dataset_info.json").write_text(json.dumps({
        "tiny_alpaca": {"file_name": "alpaca.json"},
        "tiny_chat": {"file_name": "chat.json", "formatting": "sharegpt", "columns": {"messages": "conversations"}},
        "tiny_text": {"file_name": "text.jsonl", "columns": {"prompt": "text"}},
    }))
    return folder


@pytest.fixture()
def data_dir(tmp_path) -> Path:
    """A dataset_dir with small alpaca, sharegpt and text datasets registered in dataset_info.json."""
    return write_tiny_datasets(tmp_path)


def tiny_sft_config(model_dir: Path, data: Path, output_dir: Path | str, **overrides: object) -> dict:
    config = {
        "model_name_or_path": str(model_dir), "stage": "sft", "finetuning_type": "lora",
        "dataset": "tiny_alpaca", "dataset_dir": str(data), "cutoff_len": 64,
        "output_dir": str(output_dir), "per_device_train_batch_size": 4, "max_steps": 3,
        "learning_rate": 1e-2, "save_strategy": "no", "report_to": "none", "disable_tqdm": True, "seed": 0,
    }
    config.update(overrides)
    return config


@pytest.fixture(scope="session")
def trained_run(tiny_model_dir, tmp_path_factory) -> Path:
    """One LoRA run on the tiny model, trained once per session and shared by the tests that take a finished run
    (chat, the API, every export format, the web UI's chat): llama3 template, a default system prompt and saved
    decoding keys, so each can check that what training saved reaches its door. Tests read it, never write into it.
    """
    from gym.workflows.training import run_exp

    root = tmp_path_factory.mktemp("trained-run")
    config = tiny_sft_config(tiny_model_dir, write_tiny_datasets(root), root / "out", template="llama3",
                             default_system="Answer briefly.", temperature=0.3, top_p=0.8, cutoff_len=256)
    return Path(run_exp(config).output_dir)


@pytest.fixture()
def train_config(tiny_model_dir, data_dir, tmp_path):
    """A complete, fast sft config on the tiny model; tests override what they exercise."""

    def make(**overrides):
        return tiny_sft_config(tiny_model_dir, data_dir, **{"output_dir": tmp_path / "out", **overrides})

    return make


@pytest.fixture()
def make_finetune(tiny_model_dir, tmp_path):
    """make_finetune(change, name) -> a model folder: the tiny base with change(name, param) applied in place,
    so a test knows exactly what a fine-tune changed."""
    import torch
    from transformers import AutoModelForCausalLM

    def make(change, name: str = "finetuned") -> Path:
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        with torch.no_grad():
            for param_name, param in model.named_parameters():
                change(param_name, param)
        out = tmp_path / name
        model.save_pretrained(out)
        return out

    return make


@pytest.fixture(scope="session")
def narrow_adapter(tmp_path_factory, tokenizer) -> Path:
    """A LoRA adapter on q_proj and v_proj of a 2-layer Llama half as wide (32) as the tiny base (64): one trained on
    another base, which every door that loads adapters must refuse in one line."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
    root = tmp_path_factory.mktemp("narrow")
    base.save_pretrained(root / "base")
    model = get_peft_model(LlamaForCausalLM.from_pretrained(root / "base"),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    model.save_pretrained(root / "adapter")
    return root / "adapter"


# Two of LLaMA-Factory's demo images, each with its own answer to the same question (issue #41's must-show).
VLM_QUESTION = "<image>Who is in the picture?"
VLM_ANSWERS = {"1.jpg": "They're Kane and Gretzka from Bayern Munich.",
               "2.jpg": "He's Thomas Muller from Bayern Munich."}


def write_two_image_dataset(folder: Path) -> Path:
    """A dataset_dir whose rows share one text and differ only in the image (and its answer): `who`."""
    import shutil

    (folder / "imgs").mkdir(parents=True, exist_ok=True)
    rows = []
    for name, answer in VLM_ANSWERS.items():
        shutil.copy(REPO / "data" / "mllm_demo_data" / name, folder / "imgs" / name)
        rows.append({"messages": [{"role": "user", "content": VLM_QUESTION},
                                  {"role": "assistant", "content": answer}], "images": [f"imgs/{name}"]})
    (folder / "who.json").write_text(json.dumps(rows * 4))
    (folder / "dataset_info.json").write_text(json.dumps({"who": {
        "file_name": "who.json", "formatting": "sharegpt", "columns": {"messages": "messages", "images": "images"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}}))
    return folder


@pytest.fixture(scope="session")
def taught_vlm(tmp_path_factory) -> Path:
    """tiny-llava with a LoRA adapter taught each image's answer (40 steps, ~10 s), trained once per session: the
    output folder (adapter + processor). Its dataset folder, with the two images, is the output's parent / "imgs".
    float32 (bf16: false), so greedy answers are the same on every CPU."""
    from gym.workflows.training import run_exp

    root = write_two_image_dataset(tmp_path_factory.mktemp("taught-vlm"))
    config = {"model_name_or_path": "tiny-llava", "stage": "sft", "finetuning_type": "lora", "lora_rank": 16,
              "dataset": "who", "dataset_dir": str(root), "output_dir": str(root / "out"), "max_steps": 40,
              "per_device_train_batch_size": 4, "learning_rate": 3e-3, "lr_scheduler_type": "constant",
              "save_strategy": "no", "report_to": "none", "cutoff_len": 128, "disable_tqdm": True, "bf16": False,
              "seed": 0}
    return Path(run_exp(config).output_dir)
