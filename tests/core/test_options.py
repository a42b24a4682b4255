"""The Python options classes refuse what they cannot use as the YAML parser does: a misspelt keyword names the
closest field, an impossible value names the field and what it takes."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from gym.core.errors import ConfigError, UnknownField
from gym.core.options import check_number, check_whole
from gym.delta.bitdelta import BitDeltaConfig
from gym.delta.deltaquant import DeltaQuantConfig
from gym.soup.config import DeltaSoupConfig
from gym.tfgrpo.config import GRPOConfig


@pytest.mark.parametrize("cls, typo, field", [
    (BitDeltaConfig, "distil_steps", "distill_steps"), (DeltaQuantConfig, "methd", "method"),
    (GRPOConfig, "learnig_rate", None), (GRPOConfig, "temprature_train", "temperature_train"),
    (DeltaSoupConfig, "trim_percnt", "trim_percent")])
def test_a_misspelt_keyword_is_a_config_error_naming_the_closest_field(cls, typo, field):
    with pytest.raises(ConfigError) as caught:
        cls(**{typo: 1})
    message = str(caught.value)
    if field is None:  # nothing close: every field is listed
        assert message.startswith(f"Unknown {cls.__name__} field(s): {typo}; known: ")
        assert all(f.name in message for f in dataclasses.fields(cls))
    else:
        assert message == f"Unknown {cls.__name__} field '{typo}'. Did you mean '{field}'?"
    # still the TypeError Python raises for an unexpected keyword, for code that catches that
    assert isinstance(caught.value, UnknownField) and isinstance(caught.value, TypeError)


def test_the_strict_constructor_keeps_the_dataclass_working():
    config = BitDeltaConfig(distill_steps=0, group_size=64)
    assert dataclasses.replace(config, distill_steps=5).distill_steps == 5
    assert "distill_steps" in inspect.signature(BitDeltaConfig).parameters  # help() and IDEs still see the fields
    assert GRPOConfig(5, 3).max_epochs == 3  # positional arguments as before


def test_number_checks_name_the_field_and_the_range():
    with pytest.raises(ConfigError, match=r"'p' must be in \(50, 100\], got 40"):
        check_number("p", 40, 50, 100, low_open=True)
    with pytest.raises(ConfigError, match="'lr' must be a number > 0, got nan"):
        check_number("lr", float("nan"), 0, low_open=True)
    with pytest.raises(ConfigError, match="'lr' must be a number > 0, got '1e-4'"):
        check_number("lr", "1e-4", 0, low_open=True)
    with pytest.raises(ConfigError, match="'steps' must be a whole number of at least 0, got 2.5"):
        check_whole("steps", 2.5, 0)
    with pytest.raises(ConfigError, match="whole number"):
        check_whole("steps", True, 0)  # a bool is not a count
    check_number("t", 0, 0, 2)
    check_whole("size", None, 1, optional=True)
