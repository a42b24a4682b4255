"""`gym eval CONFIG --task T [--task T2 ...] [-o results.json]` and `gym eval --compare A.json B.json`."""

from __future__ import annotations

from gym.config.files import parse_cli_args
from gym.core.errors import ConfigError

USAGE = """usage: gym eval CONFIG --task T [--task T2 ...] [--n_shot K] [--batch_size B] [--limit N] [-o results.json]
                [--log_samples] [--eval_template auto|chat|plain] [--num_samples K --temperature T]
                [--verifier accuracy|exact|regex:<p>|python:mod:fn] [--safety_judge refusal|GUARD_SPEC]
                [--delta FILE | --variant STORE:USER]
       gym eval --compare A.json B.json

CONFIG names the model as `gym chat` does (a run or model folder, model_name_or_path, adapter_name_or_path, or a
training config whose output_dir holds the run; its eval_tasks are the tasks when no --task is given). Tasks:
  mc_demo, mmlu            multiple choice: acc (the answer's letter) and acc_norm (its text, per byte)
  arithmetic, gsm8k        generation with a checked final number
  toolcall_demo            tool calling: call_rate, name_acc, args_exact (calls), no_call_acc (text turns)
  safety_demo              harmful_compliance (judged by --safety_judge) and over_refusal on 30 + 30 requests
  advbench, harmbench, xstest   the public safety sets from the hub
  mc:<data> ppl:<data> gen:<data> toolcall:<data> safety:<data>   any dataset (dataset_info.json name or file)
  lm_eval:<a>,<b>          lm-evaluation-harness tasks on the same loaded model (pip install 'zoo-gym[eval]')
See docs/eval.md."""


def _take_all(argv: list[str], name: str) -> tuple[list[str], list[str]]:
    values, rest, i = [], [], 0
    while i < len(argv):
        if argv[i] == name:
            if i + 1 >= len(argv):
                raise ConfigError(f"{name} needs a value.")
            values.append(argv[i + 1])
            i += 2
        else:
            rest.append(argv[i])
            i += 1
    return values, rest


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if "--compare" in argv:
        from gym.eval.results import compare

        i = argv.index("--compare")
        files = argv[i + 1:i + 3]
        if len(files) != 2 or any(f.startswith("--") for f in files):
            raise ConfigError("--compare takes two result files: gym eval --compare base.json tuned.json")
        others = argv[:i] + argv[i + 3:]
        if others:  # a third file, or a --task, was ignored without a word
            raise ConfigError(f"--compare takes two result files and nothing else; also given: {' '.join(others)}.")
        print(compare(*files))
        return 0
    tasks, argv = _take_all(argv, "--task")
    outputs, argv = _take_all(argv, "-o")
    config = parse_cli_args(argv, model_folders=True)
    if tasks:
        config["tasks"] = tasks
    if outputs:
        config["output"] = outputs[-1]
    from gym.eval.results import format_table
    from gym.eval.runner import run_eval

    report = run_eval(config)
    print(format_table(report["results"]))
    if config.get("output"):
        print(f"\nWrote {config['output']}")
    return 0
