"""`gym <verb>`: parse argv, call one function per verb, turn GymError into exit status 2."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable

from gym.errors import GymError

USAGE = """usage: gym <command> [options]

commands:
  train CONFIG [key=value ...] [--key value ...]   fine-tune (see `gym train --help` for every key)
  chat [CONFIG] [--key value ...] [--prompt TEXT]  talk to a model; --prompt answers once and exits
  api [CONFIG] [--key value ...] [--host H] [--port P] [--api-key KEY] [--max_batch_size N] [--max_waiting N]
                                                   OpenAI-compatible server (key also from GYM_API_KEY)
  infer CONFIG --dataset D -o out.jsonl [--batch_size N] [--max_samples N]
                                                   answer every row of a dataset (resumable)
  delta compress|apply|inspect|eval [options]      a fine-tune as a compressed delta (`gym delta -h`)
  soup init|contribute|status|aggregate|rewards    community merge of many users' deltas (`gym soup -h`)
  env                                              versions of Python, torch and the HF stack, and the device
  version                                          Gym's version

add --debug to any command to see tracebacks."""


def _setup_logging(debug: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if debug else logging.INFO, format="[gym] %(message)s")
    for noisy in ("transformers", "peft", "datasets", "accelerate", "httpx", "filelock", "urllib3", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if debug else logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not debug:
        import warnings

        import transformers

        # Deprecation notices from inside the libraries are for us, not for users.
        warnings.filterwarnings("ignore", category=FutureWarning)

        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()


def train_help() -> str:
    import dataclasses

    from gym.config.parser import ALIASES, CONCERNS, _fields, _method_option_classes, _type_name

    lines = ["usage: gym train CONFIG.yaml [key=value ...] [--key value ...]", ""]
    stages_of: dict[type, list[str]] = {}
    for stage, cls in _method_option_classes().items():
        stages_of.setdefault(cls, []).append(stage)
    sections = list(CONCERNS.items()) + [(f"{'/'.join(stages)} options", cls) for cls, stages in stages_of.items()]
    for title, cls in sections:
        lines.append(f"{title}:")
        for name, (tp, f) in _fields(cls).items():
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else None)  # type: ignore[misc]
            if hasattr(default, "value"):
                default = default.value
            text = " ".join(str(f.metadata.get("help", "")).split())
            lines.append(f"  {name} ({_type_name(tp)}, default {default!r})\n      {text}")
        lines.append("")
    lines.append("aliases: " + ", ".join(f"{k} -> {v}" for k, v in ALIASES.items()))
    return "\n".join(lines)


def cmd_train(argv: list[str]) -> int:
    if "--help" in argv or "-h" in argv:
        print(train_help())
        return 0
    if not argv:
        raise GymError("gym train needs a config: `gym train examples/quickstart.yaml` (see `gym train --help`).")
    from gym.config.parser import get_train_args, parse_cli_args
    from gym.train.run import run_exp

    args = get_train_args(parse_cli_args(argv))
    result = run_exp(args)
    print(result.summary())
    return 0


def _take_option(argv: list[str], name: str, default: str | None = None) -> tuple[str | None, list[str]]:
    """`--name value` out of argv -> (value, the rest)."""
    if name not in argv:
        return default, argv
    i = argv.index(name)
    if i + 1 >= len(argv):
        raise GymError(f"{name} needs a value.")
    return argv[i + 1], argv[:i] + argv[i + 2:]


def cmd_chat(argv: list[str]) -> int:
    prompt, argv = _take_option(argv, "--prompt")
    from gym.chat import ChatModel
    from gym.config.parser import parse_cli_args

    model = ChatModel(parse_cli_args(argv))
    try:
        if prompt is not None:
            print(f"User: {prompt}\nAssistant: ", end="", flush=True)
            for piece in model.stream_chat([{"role": "user", "content": prompt}]):
                print(piece, end="", flush=True)
            print()
            return 0
        return _interactive(model)
    finally:
        model.close()


def cmd_api(argv: list[str]) -> int:
    from gym.config.parser import parse_cli_args
    from gym.errors import ConfigError

    options = {"--host": "127.0.0.1", "--port": "8000", "--api-key": None, "--max_batch_size": "16",
               "--max_waiting": "256", "--served_model_name": None}
    values = {}
    for name, default in options.items():
        values[name], argv = _take_option(argv, name, default)
    try:
        port, batch, waiting = int(values["--port"]), int(values["--max_batch_size"]), int(values["--max_waiting"])
    except ValueError:
        raise ConfigError("--port, --max_batch_size and --max_waiting take whole numbers.") from None
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ConfigError("gym api needs FastAPI and uvicorn: pip install 'zoo-gym[serve]'.") from None
    from gym.serve.server import serve

    serve(parse_cli_args(argv), host=values["--host"], port=port, api_key=values["--api-key"],
          max_batch_size=batch, max_waiting=waiting, model_name=values["--served_model_name"])
    return 0


def _interactive(model) -> int:  # noqa: ANN001 - ChatModel, imported lazily
    print("Chat with the model. /clear resets the history, /system <text> sets the system prompt, /exit quits.")
    history: list[dict[str, str]] = []
    system = None
    while True:
        try:
            line = input("\nUser: ").strip()
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if not line:
            continue
        if line == "/exit":
            return 0
        if line == "/clear":
            history = []
            print("History cleared.")
            continue
        if line.startswith("/system"):
            system = line[len("/system") :].strip() or None
            history = []
            print(f"System prompt {'set' if system else 'cleared'}; history cleared.")
            continue
        history.append({"role": "user", "content": line})
        print("Assistant: ", end="", flush=True)
        answer = ""
        for piece in model.stream_chat(history, system):
            print(piece, end="", flush=True)
            answer += piece
        print()
        history.append({"role": "assistant", "content": answer})


def cmd_infer(argv: list[str]) -> int:
    from gym.batch_infer import run_infer
    from gym.config.parser import parse_cli_args

    dataset, argv = _take_option(argv, "--dataset")
    output, argv = _take_option(argv, "-o")
    output, argv = _take_option(argv, "--output", output)
    dataset_dir, argv = _take_option(argv, "--dataset_dir", "data")
    batch_size, argv = _take_option(argv, "--batch_size", "8")
    max_samples, argv = _take_option(argv, "--max_samples")
    if not dataset or not output:
        raise GymError("gym infer needs --dataset NAME_OR_FILE and -o OUT.jsonl: "
                       "gym infer examples/quickstart.yaml --dataset identity -o preds.jsonl")
    try:
        sizes = int(batch_size), int(max_samples) if max_samples else None
    except ValueError:
        raise GymError(f"--batch_size and --max_samples take whole numbers, got {batch_size!r}, {max_samples!r}.") from None
    path = run_infer(parse_cli_args(argv), dataset, output, dataset_dir, batch_size=sizes[0], max_samples=sizes[1])
    print(f"Wrote {path}")
    return 0


def cmd_delta(argv: list[str]) -> int:
    from gym.delta.cli import main as delta_main

    return delta_main(argv)


def cmd_soup(argv: list[str]) -> int:
    from gym.soup.cli import main as soup_main

    return soup_main(argv)


def cmd_env(argv: list[str]) -> int:
    import platform

    import torch

    print(f"gym          {_version()}")
    print(f"python       {platform.python_version()}")
    print(f"platform     {platform.platform()}")
    print(f"torch        {torch.__version__}")
    from importlib.metadata import PackageNotFoundError, version

    for name in ("transformers", "peft", "trl", "accelerate", "datasets", "safetensors", "gguf"):
        try:
            print(f"{name:<12} {version(name)}")
        except PackageNotFoundError:
            print(f"{name:<12} not installed")
    if torch.cuda.is_available():
        device = f"cuda: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    else:
        from gym.train.resources import cpu_supports_bf16

        device = f"cpu ({os.cpu_count()} cores, bf16 instructions: {'yes' if cpu_supports_bf16() else 'no'})"
    print(f"device       {device}")
    return 0


def _version() -> str:
    from gym import __version__

    return __version__


def cmd_version(argv: list[str]) -> int:
    print(_version())
    return 0


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "train": cmd_train,
    "chat": cmd_chat,
    "api": cmd_api,
    "infer": cmd_infer,
    "delta": cmd_delta,
    "soup": cmd_soup,
    "env": cmd_env,
    "version": cmd_version,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command in ("--version", "-V"):
        command = "version"
    if command not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(command, list(COMMANDS), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        print(f"gym: error: unknown command '{command}'.{hint}\n\n{USAGE}", file=sys.stderr)
        return 2
    _setup_logging(debug)
    try:
        return COMMANDS[command](rest)
    except GymError as exc:
        if debug:
            raise
        print(f"gym: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ngym: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
