"""argparse for the verbs with sub-commands (`gym delta`, `soup`, `variants`, `keys`), with Gym's errors: one
line, exit status 2 (a ConfigError, as every other bad input), the closest option or choice named, where argparse
prints its whole usage and no suggestion."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import Any, NoReturn

from gym.core.errors import ConfigError
from gym.core.names import closest

_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<value>[^']*)' \(choose from (?P<choices>.*)\)$")


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every flag `parser` takes (`-o`, `--output`, ...)."""
    return [flag for action in parser._actions for flag in action.option_strings]


def closest_flag(name: str, flags: Sequence[str]) -> str | None:
    """The flag `name` most likely misspells, compared without the dashes every flag shares."""
    by_word = {flag.lstrip("-"): flag for flag in flags}
    match = closest(name.lstrip("-"), list(by_word))
    return by_word[match] if match else None


def _chosen_subparser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The sub-command's parser `args` went through (the parser itself where it has none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None) or "")
            if isinstance(chosen, argparse.ArgumentParser):
                return _chosen_subparser(chosen, args)
    return parser


def _parser_for(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.ArgumentParser:
    """The sub-command's parser the words of `argv` choose (before argparse has parsed them)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for i, word in enumerate(argv):
                chosen = action.choices.get(word)
                if isinstance(chosen, argparse.ArgumentParser):
                    return _parser_for(chosen, argv[i + 1:])
    return parser


class CommandParser(argparse.ArgumentParser):
    def parse_args(  # type: ignore[override]  # one signature for what typeshed spells as overloads
            self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            self.refuse_extra(parsed, extra)
        return parsed

    def parse_known_args(  # type: ignore[override]
            self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        try:
            return super().parse_known_args(args, namespace)
        except ConfigError as exc:
            # argparse says a required flag is missing before it looks at the ones it does not know, so
            # `--usr alice` read "one of --user --admin is required": the misspelling is the news.
            if args is None or "required" not in str(exc):
                raise
            command = _parser_for(self, args)
            flags = option_strings(command)
            for arg in args:
                name = arg.split("=", 1)[0]
                if name.startswith("--") and name not in flags and (match := closest_flag(name, flags)):
                    raise ConfigError(f"{command.prog}: unrecognized argument {name}. Did you mean {match}? "
                                      f"(`{command.prog} -h` lists what it takes.)") from None
            raise

    def refuse_extra(self, parsed: argparse.Namespace, extra: list[str]) -> NoReturn:
        """An argument the (sub-)command does not take: named, with the closest of that command's flags."""
        command = _chosen_subparser(self, parsed)
        flags = option_strings(command)
        hint = ""
        for arg in extra:
            match = closest_flag(arg.split("=", 1)[0], flags) if arg.startswith("-") else None
            if match:
                hint = f" Did you mean {match}?"
                break
        raise ConfigError(f"{command.prog}: unrecognized arguments: {' '.join(extra)}.{hint} (`{command.prog} -h` "
                          "lists what it takes.)")

    def error(self, message: str) -> NoReturn:
        found = _INVALID_CHOICE.search(message)
        if found is not None:
            choices = re.findall(r"'([^']*)'", found["choices"])
            match = closest(found["value"], choices)
            message = f"{message}." + (f" Did you mean '{match}'?" if match else "")
        else:
            message = f"{message}."
        raise ConfigError(f"{self.prog}: {message} (`{self.prog} -h` lists what it takes.)")
