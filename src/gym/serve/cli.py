"""`gym api [CONFIG] [--host H] [--port P] ...`: the OpenAI-compatible server.

The config's `serving:` block (gym.config.aliases) sets the batch size and how many requests are admitted
at once (the queue is what the batch leaves of it); a flag given on the command line wins over it.
"""

from __future__ import annotations

from gym.config.aliases import server_options
from gym.config.files import parse_cli_args, take_option
from gym.core.errors import ConfigError
from gym.core.network import check_port_number

OPTIONS: dict[str, str | None] = {
    "--host": "127.0.0.1", "--port": "8000", "--api-key": None, "--max_batch_size": "16", "--max_waiting": "256",
    "--served_model_name": None, "--max_body_bytes": str(4 << 20), "--variants": None, "--experiences": None,
}


USAGE = """usage: gym api [CONFIG] [key=value ...] [--host 127.0.0.1] [--port 8000] [--api-key KEY]
               [--max_batch_size 16] [--max_waiting 256] [--served_model_name NAME] [--max_body_bytes N]
               [--variants STORE] [--experiences FILE]

An OpenAI-compatible server (/v1/chat/completions, /v1/completions, /v1/models, /tokenize) for the model CONFIG
names, as `gym chat` loads it. --variants STORE serves each user's variant as BASE:USER in the same batches.
See docs/serving.md."""


def main(argv: list[str]) -> int:
    if "--help" in argv or "-h" in argv:
        print(USAGE)
        return 0
    given: dict[str, str | None] = {}
    for name in OPTIONS:
        given[name], argv = take_option(argv, name)
    config = parse_cli_args(argv)
    block = server_options(config)
    if given["--max_batch_size"] is None and "batch_size" in block:
        given["--max_batch_size"] = str(block["batch_size"])
    values = {name: given[name] or default for name, default in OPTIONS.items()}
    if given["--max_waiting"] is None and "max_concurrent" in block:
        # the block counts every admitted request; the server's queue is what the running batch leaves
        batch = int(values["--max_batch_size"] or "16")
        if block["max_concurrent"] < batch:
            raise ConfigError(f"serving.max_concurrent ({block['max_concurrent']}) is below the batch size ({batch}): "
                              "it counts every request admitted at once, decoding or queued.")
        values["--max_waiting"] = str(block["max_concurrent"] - batch)
    try:
        port, batch, waiting, body = (int(values[k] or "") for k in ("--port", "--max_batch_size", "--max_waiting",
                                                                     "--max_body_bytes"))
    except ValueError:
        raise ConfigError("--port, --max_batch_size, --max_waiting and --max_body_bytes take whole numbers.") from None
    check_port_number(port)  # at once; whether the port is free is known when serve() binds it, before loading
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ConfigError("gym api needs FastAPI and uvicorn: pip install 'zoo-gym[serve]'.") from None
    from gym.serve.server import serve

    serve(config, host=values["--host"] or "127.0.0.1", port=port, api_key=values["--api-key"],
          max_batch_size=batch, max_waiting=waiting, model_name=values["--served_model_name"], max_body_bytes=body,
          variants=values["--variants"], experiences=values["--experiences"])
    return 0
