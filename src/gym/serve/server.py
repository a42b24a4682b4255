"""Run the OpenAI-compatible server: take the port, load the model, build the app, hand it to uvicorn.

The port is bound first (gym.core.network), so a port in use or out of range is one line before minutes of
loading, and uvicorn serves on that very socket, so no other program can take the port while the model loads.

uvicorn turns SIGTERM and SIGINT into a graceful shutdown: it stops accepting connections, lets
requests in flight finish (for at most `graceful_seconds`), then the app's lifespan stops the engine.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import uvicorn

from gym.core import heap
from gym.core.errors import ConfigError
from gym.core.network import bind_sockets, ready_to_listen
from gym.delta.format import fingerprint
from gym.delta.weights import parameters
from gym.infer.chat import ChatModel
from gym.personalization.source import StoreSource
from gym.personalization.store import VariantStore
from gym.safety.guard import load_guard
from gym.serve.app import create_app
from gym.serve.guarding import GuardPolicy
from gym.serve.limits import DEFAULT_GUARD_WINDOW, DEFAULT_MAX_BODY_BYTES
from gym.serve.media import MediaPolicy
from gym.service.files import FileLimits
from gym.service.keys import any_keys
from gym.service.limits import JobLimits
from gym.service.service import Service, open_service
from gym.service.worker import WorkerPool
from gym.tfgrpo.library import ExperienceLibrary

logger = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    """uvicorn, except that a SIGTERM/SIGINT handled by draining ends the process with status 0.
    uvicorn re-raises the signal after its graceful shutdown, so a clean stop looked like a kill (-15)
    to supervisors."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            yield
            self._captured_signals.clear()


def served_model_name(chat_model: ChatModel, explicit: str | None = None) -> str:
    """What clients pass as `model`: explicit, else the adapter's or model's folder name."""
    if explicit:
        return explicit
    source = chat_model.adapters[-1] if chat_model.adapters else str(chat_model.model_args.model_name_or_path)
    return Path(source.rstrip("/")).name or "gym"


def serve(config: dict[str, Any], *, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          max_batch_size: int = 16, max_waiting: int = 256, model_name: str | None = None,
          max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, variants: str | None = None,
          experiences: str | None = None, graceful_seconds: float = 30.0, media: MediaPolicy | None = None,
          db: str | None = None, file_limits: FileLimits | None = None, train_workers: int = 1,
          job_limits: JobLimits | None = None, job_options: dict[str, Any] | None = None,
          guard: str | None = None, guard_window: int = DEFAULT_GUARD_WINDOW, guard_threshold: float = 0.5) -> None:
    """`variants`: a variant store (gym.personalization) whose users' variants answer as `<model>:<user>`.
    `experiences`: a Training-Free GRPO library (experiences.json) added to every chat's system prompt.
    `media`: where a vision-language model's image URLs may be read from (default: data: URLs only).
    `db`: the database of the store's keys and files (default: `<variants>/service.db`; docs/service.md).
    `train_workers`: processes that run the store's fine-tuning jobs (gym.service.worker); `job_limits`: each user's
    quotas of waiting and running jobs; `job_options`: the operator's training keys and delta method for every job.
    `guard`: a guard spec (gym.safety.guard) that checks every request and answer, `guard_window` tokens at a time,
    flagging at `guard_threshold`; it also answers /v1/moderations."""
    api_key = api_key or os.environ.get("GYM_API_KEY") or None
    library = ExperienceLibrary.load(experiences) if experiences else None  # a bad file fails before the model loads
    source = variant_source(variants) if variants else None
    # the database opens (and a bad --db fails) before the port is taken and the model loads
    service = open_service(source.store.root, db, file_limits, job_limits) if source is not None else None
    # a guard is loaded before the port is taken too: a bad spec or keywords file is one line, not a dead server
    policy = GuardPolicy(load_guard(guard, threshold=guard_threshold), window=guard_window) if guard else None
    sockets = bind_sockets(host, port)  # bound, not listening: clients are refused until the model is ready
    pool: WorkerPool | None = None
    try:
        chat_model = ChatModel(config, max_batch_size=max_batch_size, max_waiting=max_waiting, variants=source)
        if source is not None:
            check_store_base(source.store, chat_model.model)
        _ = chat_model.engine  # start the engine now: a backend that cannot start fails before the port opens
        name = served_model_name(chat_model, model_name)
        app = create_app(chat_model, name, api_key, max_body_bytes=max_body_bytes, experiences=library, media=media,
                         service=service, guard=policy)
        if policy is not None:
            logger.info("Every request and answer is checked by the guard %s (answers every %d tokens).",
                        policy.guard.spec, policy.window)
        if library is not None:
            logger.info("Every chat request gets the %d experiences of %s in its system prompt.", len(library),
                        experiences)
        logger.info("Serving '%s' on http://%s:%d/v1 (auth: %s, batch up to %d, queue %d)", name, host, port,
                    _auth(api_key, service), max_batch_size, max_waiting)
        # uvicorn annotates timeout_graceful_shutdown as int, but only hands it to asyncio.wait_for (any float).
        server = DrainingServer(uvicorn.Config(app, host=host, port=port, log_level="info", access_log=False,
                                               timeout_graceful_shutdown=graceful_seconds))  # type: ignore[arg-type]
        if service is not None:
            # the workers train from the weights this server loaded; jobs a killed server left running go back first
            pool = WorkerPool(service.jobs, train_workers, db_url=db, options=job_options,
                              base_path=str(chat_model.model_args.model_name_or_path))
            pool.start()
        heap.work_begins()  # a server of days collects its garbage as CPython always does
        server.run(ready_to_listen(sockets))
    finally:
        if pool is not None:
            pool.stop()
        for sock in sockets:  # uvicorn closes them on shutdown; an error before it started leaves them to us
            sock.close()
    logger.info("Stopped.")


def _auth(api_key: str | None, service: Service | None) -> str:
    if service is not None and any_keys(service.db):
        return f"the store's keys ({service.db.url})" + (" and --api-key as an admin key" if api_key else "")
    return "bearer key" if api_key else "none"


def variant_source(store_path: str) -> StoreSource:
    store = VariantStore(store_path)
    if not store.root.is_dir():
        raise ConfigError(f"--variants {store_path}: no such variant store (a folder made by `gym variants create` "
                          "or `gym variants add`).")
    return StoreSource(store)


def check_store_base(store: VariantStore, model: Any) -> None:
    """Refuse a store of variants of another model: its base fingerprint is checked on the loaded weights where
    they are as the deltas were made against (float32); a model served in another dtype is only named."""
    base = store.base()
    if base is None or model is None:
        return
    if next(model.parameters()).dtype != torch.float32:
        logger.warning("The store's base fingerprint is computed on float32 weights and this model is %s: serving "
                       "its variants as variants of %r unchecked.", next(model.parameters()).dtype, base.get("name"))
        return
    if fingerprint(parameters(model)) != base.get("fingerprint"):
        raise ConfigError(f"--variants {store.root}: its variants were made from {base.get('name')!r}, whose weights "
                          "differ from the served model's (base fingerprints differ). Serve that base model.")
