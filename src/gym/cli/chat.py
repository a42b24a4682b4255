"""`gym chat`: one answer (--prompt) or a conversation on the terminal, with tools and images; the model is
ChatModel's (gym.infer.chat), whatever the config names."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from gym.config.files import take_option
from gym.core.errors import ConfigError, GymError
from gym.core.heap import work_begins

if TYPE_CHECKING:
    from gym.infer.chat import ChatModel


CHAT_USAGE = """usage: gym chat [CONFIG | FOLDER] [key=value ...] [--prompt TEXT] [--tools FILE] [--image PATH ...]

Talk to a model: a short name (smollm2-135m), a hub id or folder (model_name_or_path=...), a training config (its
finished output_dir: the adapter on its base, with the trained chat template and system prompt), an adapter
(adapter_name_or_path=...), or a FOLDER (`gym chat saves/run`: a LoRA run's adapter on its base, or a model folder).
Without --prompt, a conversation on the terminal (/clear, /exit). Decoding keys: temperature, top_p, top_k,
max_new_tokens, repetition_penalty, do_sample; engine keys: infer_backend, infer_dtype.
--tools FILE: a JSON list of functions (OpenAI's `tools`) the model may call; its calls are shown as
`-> name({...})`, and the next line you type is sent back as their result. --image PATH (repeatable), for a
vision-language model: the images go with --prompt, or with the first message of each conversation, before its
text (or where you write <image>). See docs/inference.md, docs/tools.md."""


def main(argv: list[str]) -> int:
    if "--help" in argv or "-h" in argv:
        print(CHAT_USAGE)
        return 0
    prompt, argv = take_option(argv, "--prompt")
    tools_file, argv = take_option(argv, "--tools")
    images: list[str] = []
    while True:
        image, argv = take_option(argv, "--image")
        if image is None:
            break
        images.append(image)
    from gym.config.files import parse_cli_args
    from gym.config.parser import check_keys
    from gym.data.media import load_image
    from gym.infer.chat import ChatModel

    tools = _read_tools(tools_file) if tools_file else None
    for image in images:  # a missing or broken file is one line now, before the model loads
        load_image(image, where=f"--image {image}").close()
    placed = (prompt or "").count("<image>")
    if images and placed not in (0, len(images)):
        raise ConfigError(f"--prompt has {placed} <image> placeholder(s) for {len(images)} --image file(s): write one "
                          "<image> where each image goes, or none to put them all before the text.")
    config = parse_cli_args(argv, model_folders=True)
    check_keys(config, ["--prompt", "--tools", "--image"])
    model = ChatModel(config)
    try:
        if images and model.media is None:
            raise GymError(f"--image: the model is a text model ({model.model_path}); it takes no images. Chat with a "
                           "vision-language model to send images.")
        if tools:
            model.prepare([{"role": "user", "content": ""}], tools=tools)  # a template without tools says so now
        # Status goes to stderr (logging) and the answer to stdout; starting the engine first also keeps a
        # terminal, which shows both, from printing the engine's start-up lines inside the answer line.
        model.start()
        if prompt is not None:
            print(f"User: {prompt}\nAssistant: ", end="", flush=True)
            _answer(model, [{"role": "user", "content": prompt}], None, tools, images, seed=sampling_seed(config))
            return 0
        work_begins()  # a conversation of hours collects its garbage as CPython always does
        return _interactive(model, tools, images, seed=sampling_seed(config))
    finally:
        model.close()


def sampling_seed(config: dict[str, Any]) -> int | None:
    """The config's `seed` for sampling (row i of `gym infer` samples with seed + i)."""
    seed = config.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ConfigError(f"seed must be a whole number of at least 0, got {seed!r}.")
    return seed


def _read_tools(path: str) -> list[dict[str, Any]]:
    import json

    from gym.data.tools import ToolError, parse_tools

    try:
        return parse_tools(json.loads(open(path, encoding="utf-8").read()))
    except OSError as e:
        raise GymError(f"--tools {path}: cannot be read ({e.strerror}).") from None
    except (json.JSONDecodeError, ToolError) as e:
        raise GymError(f"--tools {path}: {e}; give a JSON list of functions, as OpenAI's `tools`.") from None


def _answer(model: ChatModel, history: list[dict[str, Any]], system: str | None,
            tools: list[dict[str, Any]] | None, images: list[str] | None = None,
            seed: int | None = None) -> dict[str, Any]:
    """Print the answer as it comes, then its calls; the assistant turn to keep in the history. `images`: those
    of the conversation (its placeholders stay in the history, so every turn re-sends them). `seed` (the config's
    `seed=`): the same conversation samples the same answer."""
    from gym.infer.tool_choice import describe_calls

    stream = model.stream_reply(history, system, tools=tools, images=images or (), seed=seed)
    for piece in stream:
        print(piece, end="", flush=True)
    reply = stream.reply
    assert reply is not None
    if reply.calls:
        print(("\n" if reply.content else "") + describe_calls(reply.calls), end="")
    print()
    return {"role": "assistant", "content": reply.content, "tool_calls": reply.calls}


CHAT_COMMANDS = ("/clear", "/system", "/exit")


def _interactive(model: ChatModel, tools: list[dict[str, Any]] | None = None, images: list[str] | None = None,
                 seed: int | None = None) -> int:
    from gym.infer.tool_choice import RequestFieldError

    print("Chat with the model. /clear resets the history, /system <text> sets the system prompt, /exit quits.")
    history: list[dict[str, Any]] = []
    system = None
    while True:
        calling = bool(history and history[-1].get("tool_calls"))
        try:
            line = input("\nTool result: " if calling else "\nUser: ").strip()
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
        if re.match(r"/[A-Za-z]+$", line.split(" ", 1)[0]):  # `/exti`: a command mistyped, not a message to send
            from gym.core.names import did_you_mean

            word = line.split(" ", 1)[0]
            print(f"Unknown command {word}.{did_you_mean(word, CHAT_COMMANDS)} The commands: "
                  f"{', '.join(CHAT_COMMANDS)} (/system takes the prompt's text).")
            continue
        if images and not history and "<image>" not in line:
            line = "<image>" * len(images) + line  # the conversation's images go with its first message
        # After calls, the line is their result (a tool message), as an application would send it.
        history.append({"role": "observation" if calling else "user", "content": line})
        print("Assistant: ", end="", flush=True)
        try:
            history.append(_answer(model, history, system, tools, images, seed=seed))
        except RequestFieldError as e:  # this message cannot be sent (placeholders that miss the images, ...)
            history.pop()  # the conversation so far is kept; the message is not, so the next one can be sent
            print(f"\n{e} This message was not sent; type it again.", flush=True)
