"""The variants an engine serves: loaded on first use, reloaded when replaced, refused once deleted.

A `VariantSource` (the personalization store, in gym.personalization) says which variants exist, a
version string for each (it changes when a variant is replaced), and loads one's per-parameter deltas.
The bank compiles a variant for the decoder the first time a request names it and keeps it while its
version stands; a request holds its compiled variant, so deleting or replacing a variant never changes
an answer already running, and the next request sees the change without a restart. A variant that cannot be
loaded (VariantUnavailable) is refused to the requests naming it until it is replaced; the base and every other
variant are served as before.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

import torch

from gym.core.errors import GymError
from gym.infer.fast.deltas import CompiledVariant, ParamDelta, UnpackedCache, compile_variant

logger = logging.getLogger(__name__)


class VariantNotFound(GymError):
    """A request named a variant the engine's source does not hold (HTTP 404)."""


class VariantUnavailable(GymError):
    """A variant the source holds but that cannot be served: its files are damaged or do not fit the base. The
    requests naming it are refused; the base and every other variant are served as before."""


class VariantSource(Protocol):
    def names(self) -> list[str]: ...

    def version(self, name: str) -> str | None:
        """An id of the variant's current content, or None when there is no such variant."""

    def load(self, name: str) -> dict[str, ParamDelta]:
        """The variant's delta per parameter name of the base."""


class VariantBank:
    def __init__(self, source: VariantSource, model: Any, *, cache_mb: int = 256) -> None:
        self.source = source
        self.model = model
        self.device = next(model.parameters()).device
        self.cache = UnpackedCache(cache_mb << 20)
        self._compiled: dict[str, CompiledVariant] = {}
        self._failed: dict[str, tuple[str, str]] = {}  # name -> (version, why): not read again until replaced
        self._lock = threading.Lock()
        self._loading: dict[str, threading.Lock] = {}

    def names(self) -> list[str]:
        return self.source.names()

    def has(self, name: str) -> bool:
        return self.source.version(name) is not None

    def get(self, name: str) -> CompiledVariant:
        """The compiled variant `name` at its current version (loading it if new or replaced)."""
        version = self.source.version(name)
        if version is None:
            self.forget(name)
            raise VariantNotFound(f"No variant {name!r} is being served.")
        with self._lock:
            found = self._compiled.get(name)
            if found is not None and found.version == version:
                return found
            loading = self._loading.setdefault(name, threading.Lock())
        with loading:  # one load per variant at a time; others asking for it wait for that one
            with self._lock:
                found = self._compiled.get(name)
                failed = self._failed.get(name)
            if found is not None and found.version == version:
                return found
            if failed is not None and failed[0] == version:
                raise VariantUnavailable(failed[1])
            compiled = self._compile(name, version)
            with self._lock:
                old = self._compiled.get(name)
                self._compiled[name] = compiled
                self._failed.pop(name, None)
            if old is not None:
                self.cache.drop(old.uid)
            return compiled

    def _compile(self, name: str, version: str) -> CompiledVariant:
        """Load and arrange one variant. Its files come from users, so whatever fails in reading them makes this
        variant unavailable, not the server: a GymError (damaged, or not of this base) is remembered for this
        version, so its requests are refused at once without reading the files again; anything else (a library's
        error on a file it cannot parse, or memory) is logged with its traceback and tried again next time."""
        try:
            with torch.inference_mode(False), torch.no_grad():
                return compile_variant(name, version, self.source.load(name), self.model, self.cache, self.device)
        except GymError as exc:
            why = f"The variant {name!r} cannot be served: {exc}"
            with self._lock:
                self._failed[name] = (version, why)
            raise VariantUnavailable(why) from None
        except Exception as exc:
            logger.exception("Variant %r could not be loaded", name)
            raise VariantUnavailable(f"The variant {name!r} cannot be served: {exc!r}") from None

    def forget(self, name: str) -> None:
        with self._lock:
            old = self._compiled.pop(name, None)
        if old is not None:
            self.cache.drop(old.uid)

    @property
    def resident_bytes(self) -> int:
        with self._lock:
            return sum(v.nbytes for v in self._compiled.values()) + self.cache.used
