"""`gym api [CONFIG] [--host H] [--port P] ...`: the OpenAI-compatible server.

The config's `serving:` block (gym.config.serving) sets the batch and queue sizes; a flag given on the
command line wins over it.
"""

from __future__ import annotations

from gym.config.files import parse_cli_args
from gym.config.serving import server_options
from gym.core.errors import ConfigError, GymError

OPTIONS: dict[str, str | None] = {
    "--host": "127.0.0.1", "--port": "8000", "--api-key": None, "--max_batch_size": "16", "--max_waiting": "256",
    "--served_model_name": None, "--max_body_bytes": str(4 << 20), "--variants": None, "--experiences": None,
}


def _take(argv: list[str], name: str) -> tuple[str | None, list[str]]:
    if name not in argv:
        return None, argv
    i = argv.index(name)
    if i + 1 >= len(argv):
        raise GymError(f"{name} needs a value.")
    return argv[i + 1], argv[:i] + argv[i + 2:]


def main(argv: list[str]) -> int:
    given: dict[str, str | None] = {}
    for name in OPTIONS:
        given[name], argv = _take(argv, name)
    config = parse_cli_args(argv)
    from_block = {f"--{k}": str(v) for k, v in server_options(config).items()}
    values = {name: given[name] or from_block.get(name) or default for name, default in OPTIONS.items()}
    try:
        port, batch, waiting, body = (int(values[k] or "") for k in ("--port", "--max_batch_size", "--max_waiting",
                                                                     "--max_body_bytes"))
    except ValueError:
        raise ConfigError("--port, --max_batch_size, --max_waiting and --max_body_bytes take whole numbers.") from None
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
