"""`gym soup init | contribute | status | aggregate | rewards`: a DeltaSoup folder on the command line.

    gym soup init my-soup --base smollm2-135m method=byzantine_robust min_contributors=3 [--safety-gate SET]
    gym soup contribute my-soup --user alice saves/alice-lora --samples 400
    gym soup status my-soup
    gym soup aggregate my-soup -o soup-model
    gym soup rewards my-soup

`contribute` exits with 1 when the contribution is rejected (the reason is printed), so scripts can tell. A soup made
with `--safety-gate SET` rejects a contribution whose harmful compliance rose past its base's, with the numbers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

from gym.cli.arguments import CommandParser
from gym.cli.gates import add_gate_flags
from gym.core.errors import ConfigError
from gym.soup.config import DeltaSoupConfig
from gym.soup.soup import DeltaSoup
from gym.soup.store import LEDGER


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="gym soup", description="Merge many users' fine-tunes of one base into a "
                           "community delta: robust to attackers, optionally private, contributors paid.")
    sub = parser.add_subparsers(dest="verb", required=True)

    i = sub.add_parser("init", help="create a soup folder for one base model")
    i.add_argument("path", help="the soup folder to create")
    i.add_argument("--base", required=True,
                   help="the base every contribution was fine-tuned from (short name, hub id or folder)")
    i.add_argument("--config", help="a YAML/JSON file of DeltaSoupConfig fields")
    i.add_argument("options", nargs="*", metavar="key=value", help="DeltaSoupConfig fields, e.g. method=median "
                   "differential_privacy=true clip_norm=0.5 (override --config)")
    add_gate_flags(i)  # each contribution is gated: the soup's safety_gate* fields

    c = sub.add_parser("contribute", help="add a fine-tune to the open round (accepted or rejected with the reason)")
    c.add_argument("path")
    c.add_argument("model", help="a model folder, a LoRA adapter folder or a Gym delta file (.safetensors)")
    c.add_argument("--user", required=True, help="the contributor's id")
    c.add_argument("--samples", type=int, help="training examples behind it (weighted_mean weighs by them)")

    s = sub.add_parser("status", help="rounds, contributions by status, privacy spent")
    s.add_argument("path")
    s.add_argument("--json", action="store_true", help="print the status as JSON")

    a = sub.add_parser("aggregate", help="merge the open round and open the next")
    a.add_argument("path")
    a.add_argument("--min-contributors", type=int, help="default: the soup's min_contributors")
    a.add_argument("-o", "--output", help="also write base + aggregate as a model folder here")
    a.add_argument("--overwrite", action="store_true", help="replace an existing model folder at --output")

    r = sub.add_parser("rewards", help="what each contributor earned")
    r.add_argument("path")
    which = r.add_mutually_exclusive_group()  # one round's rewards, or every round's summed
    which.add_argument("--round", type=int, help="default: the last aggregated round")
    which.add_argument("--cumulative", action="store_true", help="sum over every round")
    r.add_argument("--json", action="store_true")
    return parser


def config_from(config_file: str | None, options: list[str], flags: dict[str, Any] | None = None) -> Any:
    """DeltaSoupConfig from an optional YAML/JSON file, then key=value overrides (values parsed as YAML), then the
    fields the flags set."""
    values: dict[str, Any] = {}
    if config_file:
        from gym.config.files import load_config_file

        path = Path(config_file)
        if not path.is_file():
            raise ConfigError(f"Soup config file not found: {path}")
        try:  # a file that is no text, or no valid YAML, is one line naming where, as a training config's is
            loaded = load_config_file(path)
        except ConfigError as exc:
            raise ConfigError(f"Soup config: {exc}") from None
        if not loaded:
            raise ConfigError(f"{path} must hold a mapping of DeltaSoupConfig fields, e.g. `method: median`.")
        values.update(loaded)
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or not key:
            raise ConfigError(f"Soup options are key=value (e.g. method=median), got {option!r}.")
        values[key.strip()] = yaml.safe_load(value)
    values.update(flags or {})
    return DeltaSoupConfig.from_dict(values)


def init(args: argparse.Namespace) -> int:
    if (Path(args.path) / LEDGER).exists():
        raise ConfigError(f"{args.path} is already a soup; contribute to it, or choose another folder.")
    config = config_from(args.config, args.options, _gate_fields(args))
    if config.safety_gate is not None:
        config.gate().check()  # the set reads and the judge loads, before the first contribution
    soup = DeltaSoup(config, path=args.path, base_model=args.base)
    gated = f", safety gate {config.safety_gate}" if config.safety_gate else ""
    print(f"Created the soup {soup.path} on {soup.base.ref} (method {config.method.value}, min_contributors "
          f"{config.min_contributors}, differential privacy {'on' if config.differential_privacy else 'off'}"
          f"{gated}).")
    return 0


def _gate_fields(args: argparse.Namespace) -> dict[str, Any]:
    """--safety-gate and its companions as DeltaSoupConfig fields (only those given)."""
    if args.safety_gate is None:
        if args.safety_judge != "refusal" or args.safety_max_rise != 0.05 or args.safety_max_new_tokens != 64:
            raise ConfigError("--safety-judge, --safety-max-rise and --safety-max-new-tokens set the soup's safety "
                              "gate: give --safety-gate SET too.")
        return {}
    return {"safety_gate": args.safety_gate, "safety_judge": args.safety_judge, "safety_max_rise": args.safety_max_rise,
            "safety_max_new_tokens": args.safety_max_new_tokens}


def contribute(args: argparse.Namespace) -> int:
    record = DeltaSoup(path=_existing(args.path)).contribute(args.user, args.model, num_samples=args.samples)
    if record.accepted:
        print(f"Accepted {args.user}'s contribution #{record.id} into round {record.round} (norm {record.norm:.4g}).")
        return 0
    print(f"Rejected {args.user}'s contribution #{record.id} (round {record.round}): {record.reason}")
    return 1


def status(args: argparse.Namespace) -> int:
    info = DeltaSoup(path=_existing(args.path)).status()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"soup {info['path']}: base {info['base_model']}, method {info['method']}")
    print(f"rounds aggregated: {info['rounds']}; open round: {info['open_round']} "
          f"({_counts(info['open_round_contributions'])})")
    print(f"contributions: {_counts(info['contributions'])} from {info['contributors']} contributor(s)")
    total = info["privacy"]["total"]
    if total:
        print(f"privacy spent over {total['rounds']} round(s): epsilon {total['epsilon']:.3g} at delta "
              f"{total['delta']:.1e}")
    else:
        print("privacy: differential privacy " + ("on, no round yet" if info["privacy"]["differential_privacy"]
                                                  else "off"))
    return 0


def aggregate(args: argparse.Namespace) -> int:
    soup = DeltaSoup(path=_existing(args.path))
    soup.aggregate(min_contributors=args.min_contributors, output_dir=args.output, overwrite=args.overwrite)
    record = soup.store.rounds()[-1]
    print(f"Round {record.id}: {record.method} over {record.n} contribution(s), {len(record.selected)} selected.")
    if record.privacy:
        print(f"Privacy: epsilon {record.privacy['epsilon']:.3g}, delta {record.privacy['delta']:.1e} "
              f"(noise sigma {record.privacy['sigma']:.3g}).")
    if args.output:
        print(f"Wrote {args.output} (base + aggregate; `gym chat model_name_or_path={args.output}`).")
    return 0


def rewards(args: argparse.Namespace) -> int:
    amounts = DeltaSoup(path=_existing(args.path)).calculate_rewards(args.round, cumulative=args.cumulative)
    if args.json:
        print(json.dumps(amounts, indent=2))
        return 0
    print(f"{'contributor':<24} {'reward':>12}")
    for user, amount in sorted(amounts.items(), key=lambda kv: -kv[1]):
        print(f"{user:<24} {amount:>12.2f}")
    return 0


def _existing(path: str) -> str:
    if not (Path(path) / LEDGER).is_file():
        raise ConfigError(f"{path} is not a soup; create it with `gym soup init {path} --base MODEL`.")
    return path


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{v} {k}" for k, v in counts.items()) or "none"


VERBS = {"init": init, "contribute": contribute, "status": status, "aggregate": aggregate, "rewards": rewards}


def main(argv: list[str]) -> int:
    parser = _parser()
    # argparse gives a positional nargs="*" only the words before the first option, so key=value pairs after
    # --base or --config come back as extras; they belong to init.
    args, extra = parser.parse_known_args(argv)
    if extra and (args.verb != "init" or any(word.startswith("-") for word in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.options = [*args.options, *extra]
    return VERBS[args.verb](args)
