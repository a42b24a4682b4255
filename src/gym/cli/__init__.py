"""`gym <verb>`: parse argv, call one function per verb, turn a user's error into one line and exit status 2.

Each verb imports what it needs when it runs, so `gym --help` and `gym version` stay instant. Errors a
user can cause are GymErrors; known failures of the machine or a library (no space left, a broken
safetensors file) are translated by gym.core.errors.as_gym_error; anything else is a bug and keeps
its traceback. `--debug` shows the traceback in every case.

To add a verb: a `cmd_<verb>(argv) -> int` function, a line in COMMANDS and one in USAGE. A verb with
sub-commands of its own (`gym delta compress`, `gym soup contribute`, ...) or a loop of its own (`gym chat`'s
conversation) has its module here, gym/cli/<verb>.py:
every door of the command line lives in this package, and the jobs it calls know nothing of argv.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import warnings
from collections.abc import Callable

from gym.config.files import take_flag, take_option
from gym.core.errors import ConfigError, GymError, RunStopped, as_gym_error, caused_by_interrupt
from gym.core.heap import deferred_full_collections
from gym.core.version import __version__

USAGE = """usage: gym <command> [options]

commands:
  train CONFIG [key=value ...] [--key value ...]   fine-tune (`gym train --help` lists every key; or --config CONFIG)
  tune CONFIG [--trials 10] [--metric M] [--direction minimize|maximize]
                                                   hyper-parameter search over the config's `tune:` section
  chat [CONFIG] [--key value ...] [--prompt TEXT]  talk to a model; --prompt answers once and exits
  api [CONFIG] [--key value ...] [--host H] [--port P] [--api-key KEY] [--max_batch_size N] [--max_waiting N]
      [--max_body_bytes N] [--variants STORE] [--experiences FILE]
                                                   OpenAI-compatible server (key also from GYM_API_KEY); with
                                                   --variants, model "<name>:<user>" answers as that user's variant;
                                                   --experiences: a TF-GRPO library in every chat's system prompt
  infer CONFIG --dataset D -o out.jsonl [--batch_size N] [--max_samples N]
                                                   answer every row of a dataset (resumable; alias: inference)
  delta compress|apply|inspect|eval [options]      a fine-tune as a compressed delta (`gym delta -h`)
  soup init|contribute|status|aggregate|rewards    community merge of many users' deltas (`gym soup -h`)
  variants create|add|list|delete|chat|export STORE  per-user fine-tunes as 1-bit deltas (`gym variants -h`)
  keys create|list|revoke STORE [--user U | --admin]  API keys and tenants of `gym api --variants STORE` (`gym keys -h`)
  tfgrpo train|eval CONFIG [key=value ...]         Training-Free GRPO: learn a library of lessons in the prompt
  export CONFIG --export_dir DIR [--format hf]     the trained model for other tools (`gym export -h`)
  merge CONFIG [key=value ...]                     linear/TIES/DARE merges of fine-tunes of one base (`gym merge -h`)
  eval CONFIG --task T [--task T2 ...] [-o results.json]
                                                   multiple choice, perplexity, verified generation, lm-eval
                                                   (`gym eval -h`); --compare A B: the difference, tested
  webui [--host 127.0.0.1] [--port 7860] [--auth user:pass] [--runs_dir saves/webui] [--dataset_dir data]
        [--insecure-no-auth] [--service URL]
                                                   the web UI: train, watch, chat, compress, export, evaluate
  env                                              versions of Python, torch and the HF stack, and the device
  version                                          Gym's version

chat, api, infer, export and eval also take a run or model folder, or a model name, for CONFIG (`gym chat saves/run`).
add --debug to any command to see tracebacks."""


def _setup_logging(debug: bool) -> None:
    # Under torchrun every rank runs the same steps: the others' notes would repeat rank 0's, line for line.
    quiet_rank = not debug and int(os.environ.get("RANK", "0") or 0) > 0
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING if quiet_rank else logging.INFO,
                        format="[gym] %(message)s")
    for noisy in ("transformers", "peft", "datasets", "accelerate", "httpx", "httpx2", "openai", "filelock", "urllib3",
                  "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if debug else logging.WARNING)
    # Optional kernels these libraries look for at import (and torch's notes about them) are not the user's
    # concern: bitsandbytes and torchao work without them here.
    for optional in ("bitsandbytes", "torchao", "torch.utils._pytree"):
        logging.getLogger(optional).setLevel(logging.DEBUG if debug else logging.ERROR)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not debug:
        # Deprecation notices from inside the libraries are for us, not for users.
        warnings.filterwarnings("ignore", category=FutureWarning)
        # Through the environment, so that a verb that never loads transformers does not pay for importing it.
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        if "transformers" in sys.modules:  # already imported (Gym called in-process): tell it directly
            transformers = sys.modules["transformers"]
            transformers.utils.logging.set_verbosity_error()
            transformers.utils.logging.disable_progress_bar()


def cmd_train(argv: list[str]) -> int:
    if "--help" in argv or "-h" in argv:
        from gym.config.help import train_help

        print(train_help())
        return 0
    if not argv:
        raise GymError("gym train needs a config: `gym train examples/quickstart.yaml` (see `gym train --help`).")
    from gym.config.files import parse_cli_args
    from gym.workflows.launch import launch_elsewhere

    values, exit_code = launch_elsewhere(argv, parse_cli_args(argv))
    if exit_code is not None:  # the run happened in processes torchrun or Ray started
        return exit_code
    from gym.config.parser import get_train_args
    from gym.train.ranks import is_main_process
    from gym.workflows.training import run_exp

    args = get_train_args(values)
    result = run_exp(args)
    if is_main_process():
        print(result.summary())
    return 0


def cmd_tune(argv: list[str]) -> int:
    if "--help" in argv or "-h" in argv or not argv:
        print("usage: gym tune CONFIG [--trials 10] [--metric eval_loss] [--direction minimize] [key=value ...]\n\n"
              "Searches the keys of the config's `tune:` section with Optuna; each trial trains in "
              "output_dir/trial-<n>. Resumable (output_dir/tune.db); writes tune_results.md and best.yaml.")
        return 0 if argv else 2
    trials, argv = take_option(argv, "--trials", "10")
    metric, argv = take_option(argv, "--metric", "eval_loss")
    direction, argv = take_option(argv, "--direction", "minimize")
    if importlib.util.find_spec("optuna") is None:
        raise ConfigError("gym tune needs Optuna: pip install 'zoo-gym[tune]'.")
    try:
        count = int(trials or "")
    except ValueError:
        raise ConfigError(f"--trials takes a whole number, got {trials!r}.") from None
    from gym.config.files import parse_cli_args
    from gym.tune.study import tune

    result = tune(parse_cli_args(argv), count, metric=metric or "eval_loss", direction=direction or "minimize")
    print(result.table.read_text(encoding="utf-8"))
    print(f"Best: {metric} {result.best_value:.4f} with {result.best_params} ({result.completed} completed, "
          f"{result.pruned} pruned).\nRun it: gym train {result.best_config}")
    return 0


def cmd_chat(argv: list[str]) -> int:
    from gym.cli.chat import main as chat_main

    return chat_main(argv)


def cmd_api(argv: list[str]) -> int:
    from gym.serve.cli import main as api_main

    return api_main(argv)


def cmd_merge(argv: list[str]) -> int:
    from gym.cli.merge import main as merge_main

    return merge_main(argv)


def cmd_infer(argv: list[str]) -> int:
    if "--help" in argv or "-h" in argv:
        print("usage: gym infer CONFIG --dataset NAME_OR_FILE -o OUT.jsonl [--dataset_dir data] [--batch_size 8]\n"
              "                 [--max_samples N] [key=value ...]\n\n"
              "Generations for every row of a dataset, as `gym chat` answers them; resumable (rows already in OUT are "
              "kept). See docs/serving.md.")
        return 0
    from gym.cli.chat import sampling_seed
    from gym.config.files import parse_cli_args
    from gym.config.parser import check_keys
    from gym.infer.batch import run_infer

    dataset, argv = take_option(argv, "--dataset")
    output, argv = take_option(argv, "-o")
    output, argv = take_option(argv, "--output", output)
    dataset_dir, argv = take_option(argv, "--dataset_dir")
    batch_size, argv = take_option(argv, "--batch_size", "8")
    batch_size = batch_size or "8"
    max_samples, argv = take_option(argv, "--max_samples")
    if not dataset or not output:
        raise GymError("gym infer needs --dataset NAME_OR_FILE and -o OUT.jsonl: "
                       "gym infer examples/quickstart.yaml --dataset identity -o preds.jsonl")
    try:
        sizes = int(batch_size), int(max_samples) if max_samples else None
    except ValueError:
        raise GymError(f"--batch_size and --max_samples take whole numbers, got {batch_size!r}, "
                       f"{max_samples!r}.") from None
    config = parse_cli_args(argv, model_folders=True)
    check_keys(config, ["--dataset", "-o", "--output", "--dataset_dir", "--batch_size", "--max_samples"])
    # The config's dataset_dir (the one its training read) unless the flag says otherwise, as for `gym train`.
    dataset_dir = dataset_dir or str(config.get("dataset_dir") or "data")
    seed = sampling_seed(config)
    path = run_infer(config, dataset, output, dataset_dir, batch_size=sizes[0], max_samples=sizes[1],
                     seed=42 if seed is None else seed)
    print(f"Wrote {path}")
    return 0


def cmd_delta(argv: list[str]) -> int:
    from gym.cli.delta import main as delta_main

    return delta_main(argv)


def cmd_variants(argv: list[str]) -> int:
    from gym.cli.variants import main as variants_main

    return variants_main(argv)


def cmd_keys(argv: list[str]) -> int:
    if importlib.util.find_spec("sqlalchemy") is None:
        raise ConfigError("gym keys needs SQLAlchemy: pip install 'zoo-gym[serve]'.")
    from gym.cli.keys import main as keys_main

    return keys_main(argv)


def cmd_soup(argv: list[str]) -> int:
    from gym.cli.soup import main as soup_main

    return soup_main(argv)


def cmd_tfgrpo(argv: list[str]) -> int:
    from gym.cli.tfgrpo import main as tfgrpo_main

    return tfgrpo_main(argv)


def cmd_export(argv: list[str]) -> int:
    from gym.cli.export import main as export_main

    return export_main(argv)


def cmd_eval(argv: list[str]) -> int:
    from gym.cli.eval import main as eval_main

    return eval_main(argv)


def cmd_webui(argv: list[str]) -> int:
    if "--help" in argv or "-h" in argv:
        print("usage: gym webui [--host 127.0.0.1] [--port 7860] [--auth user:password] [--runs_dir saves/webui]\n"
              "                 [--dataset_dir data] [--share off] [--insecure-no-auth] [--service URL]\n\nThe web UI "
              "(docs/webui.md). It binds to 127.0.0.1; a --host other machines can reach (0.0.0.0, a LAN address) "
              "needs --auth, or --insecure-no-auth to serve it unprotected. Every job it starts is a `gym` command in "
              "its own folder under --runs_dir.\n\n--service URL: the page of a `gym api --variants STORE` "
              "server's fine-tuning service instead, where people sign in with their API keys (docs/service.md).")
        return 0
    insecure_no_auth, argv = take_flag(argv, "--insecure-no-auth")
    # `--share` alone (Gradio's switch, as its users type it) is a request to share: refused below with the reason
    share_switch = any(arg == "--share" and (i + 1 == len(argv) or argv[i + 1].startswith("--"))
                       for i, arg in enumerate(argv))
    if share_switch:
        argv = [arg for arg in argv if arg != "--share"]
    values: dict[str, str | None] = {}
    for name, default in {"--host": "127.0.0.1", "--port": "7860", "--auth": None, "--runs_dir": "saves/webui",
                          "--dataset_dir": "data", "--share": "off", "--service": None}.items():
        values[name], argv = take_option(argv, name, default)
    if argv:
        raise ConfigError(f"gym webui: unknown argument {argv[0]!r} (see gym webui --help).")
    if share_switch or values["--share"] not in ("off", "false", "no"):
        raise ConfigError("gym webui --share: public share links send the page through Gradio's servers; Gym "
                          "keeps the UI on this machine. Use --host 0.0.0.0 --auth user:password on a trusted network.")
    try:
        port = int(values["--port"] or "")
    except ValueError:
        raise ConfigError(f"--port takes a whole number, got {values['--port']!r}.") from None
    auth = None
    if values["--auth"]:
        user, sep, password = values["--auth"].partition(":")
        if not (user and sep and password):
            raise ConfigError("--auth takes user:password.")
        auth = (user, password)
    if importlib.util.find_spec("gradio") is None:
        raise ConfigError("gym webui needs Gradio: pip install 'zoo-gym[webui]'.")
    from gym.webui.app import serve

    serve(host=values["--host"] or "127.0.0.1", port=port, auth=auth, runs_dir=values["--runs_dir"] or "saves/webui",
          dataset_dir=values["--dataset_dir"] or "data", insecure_no_auth=insecure_no_auth,
          service=values["--service"])
    return 0


def cmd_env(argv: list[str]) -> int:
    import platform

    import torch

    print(f"gym          {__version__}")
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
        from gym.core.hardware import cpu_supports_bf16

        device = f"cpu ({os.cpu_count()} cores, bf16 instructions: {'yes' if cpu_supports_bf16() else 'no'})"
    print(f"device       {device}")
    return 0


def cmd_version(argv: list[str]) -> int:
    print(__version__)
    return 0


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "train": cmd_train,
    "tune": cmd_tune,
    "chat": cmd_chat,
    "api": cmd_api,
    "infer": cmd_infer,
    "inference": cmd_infer,  # the Gym documents' name for it
    "delta": cmd_delta,
    "soup": cmd_soup,
    "variants": cmd_variants,
    "keys": cmd_keys,
    "tfgrpo": cmd_tfgrpo,
    "export": cmd_export,
    "merge": cmd_merge,
    "eval": cmd_eval,
    "webui": cmd_webui,
    "env": cmd_env,
    "version": cmd_version,
}


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # `gym delta inspect F | head`: the reader has what it wanted; nothing is wrong here
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own flush at exit would raise it again
        return 141  # as a shell reports a command ended by SIGPIPE


def _main(argv: list[str] | None) -> int:
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
        from gym.core.names import did_you_mean

        print(f"gym: error: unknown command '{command}'.{did_you_mean(command, COMMANDS)}\n\n{USAGE}",
              file=sys.stderr)
        return 2
    _setup_logging(debug)
    try:
        with deferred_full_collections():
            return COMMANDS[command](rest)
    except KeyboardInterrupt:
        print("\ngym: interrupted", file=sys.stderr)
        return 130
    except RunStopped as stopped:
        from gym.train.ranks import is_main_process

        if is_main_process():  # every rank of a run under torchrun stops at the same step: one line says it
            print(f"gym: {stopped}", file=sys.stderr)
        return 130
    except Exception as exc:
        if caused_by_interrupt(exc) and not debug:
            print("\ngym: interrupted", file=sys.stderr)
            return 130
        error = as_gym_error(exc)
        if error is None or debug:
            raise
        print(f"gym: error: {error}", file=sys.stderr)
        return 2
