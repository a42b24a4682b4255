"""DeltaSoup: merge many users' fine-tunes of one base into a community delta (docs/soup.md)."""

from gym.soup.aggregators import AggregationMethod
from gym.soup.config import DeltaSoupConfig
from gym.soup.soup import DeltaSoup

__all__ = ["AggregationMethod", "DeltaSoup", "DeltaSoupConfig"]
