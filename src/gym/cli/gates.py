"""The safety gate's flags, one spelling for every command that gates a fine-tune (`gym variants create`,
`gym delta compress`, `gym soup init`): `--safety-gate SET [--safety-judge J] [--safety-max-rise R]`
(gym.safety.gate). `gym api` spells them the same in its own option reader (gym.serve.cli)."""

from __future__ import annotations

import argparse
from typing import Any

from gym.core.errors import ConfigError


def add_gate_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("safety gate", "refuse the result when its harmful compliance rose past its "
                                      "base's (docs/safety.md)")
    group.add_argument("--safety-gate", metavar="SET", help="a safety set (safety_demo, advbench, harmbench, a file): "
                       "the base and the result answer it, and the result is refused when it complies with more "
                       "of its harmful requests than allowed")
    group.add_argument("--safety-judge", metavar="J", default="refusal",
                       help="who judges compliance: refusal (a string match, default) or a guard spec "
                            "(keywords:FILE, llama-guard:PATH, ...)")
    group.add_argument("--safety-max-rise", metavar="R", type=float, default=0.05,
                       help="the largest rise in harmful compliance allowed, as a share (default 0.05); a significant "
                            "rise (McNemar p < 0.05) is refused too")
    group.add_argument("--safety-max-new-tokens", metavar="N", type=int, default=64,
                       help="tokens per answer in the gate (default 64: the judge reads the first sentences)")


def gate_from(args: argparse.Namespace, dataset_dir: str = "data") -> Any:
    """The SafetyGate the flags ask for, or None without --safety-gate; flags without it are an error."""
    if args.safety_gate is None:
        if args.safety_judge != "refusal" or args.safety_max_rise != 0.05 or args.safety_max_new_tokens != 64:
            raise ConfigError("--safety-judge, --safety-max-rise and --safety-max-new-tokens set the safety gate: "
                              "give --safety-gate SET too.")
        return None
    from gym.safety.gate import SafetyGate

    return SafetyGate(args.safety_gate, judge=args.safety_judge, max_rise=args.safety_max_rise,
                      max_new_tokens=args.safety_max_new_tokens, dataset_dir=dataset_dir)
