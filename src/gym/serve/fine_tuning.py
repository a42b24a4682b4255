"""OpenAI's fine-tuning API over the store's job queue (gym.service.queue):

    POST /v1/fine_tuning/jobs                      create (model: the served base; files: the caller's ids)
    GET  /v1/fine_tuning/jobs                      the caller's jobs, newest first (`after`, `limit`)
    GET  /v1/fine_tuning/jobs/{id}                 one job
    POST /v1/fine_tuning/jobs/{id}/cancel          cancel it (a running job stops between two steps)
    GET  /v1/fine_tuning/jobs/{id}/events          its events, newest first (`after`, `limit`)
    GET  /v1/fine_tuning/jobs/{id}/checkpoints     its checkpoints, newest first (`after`, `limit`)

Another user's job or file is a 404, as one that does not exist; a model this server does not serve is a 404
naming it; an unknown field (with the closest one), a value of the wrong type or outside OpenAI's range (`seed`
0 to 2**31 - 1, `n_epochs` 1 to 50, ...: gym.service.jobs) is a 400 naming it; past the caller's quota of waiting
jobs, a 429 (and nothing is stored). Workers (gym.service.worker)
run the queued jobs; the routes only read and write rows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, StrictInt

from gym.core.errors import ConfigError
from gym.serve.protocol import ApiError
from gym.serve.tenancy import Caller
from gym.service.files import FileNotFound
from gym.service.queue import JobFinished, JobNotFound, JobQueue, QuotaExceeded

MAX_LIMIT = 100


class CreateJob(BaseModel):
    """The body OpenAI's client sends to create a job (integrations are taken and not used). Any other field is
    refused (gym.serve.protocol.invalid_request names it and the closest of these)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    training_file: str
    validation_file: str | None = None
    method: dict[str, Any] | None = None
    hyperparameters: dict[str, Any] | None = None
    suffix: str | None = None
    seed: StrictInt | None = None  # not lax: `true` or "7" would pass as a seed OpenAI refuses
    integrations: list[Any] | None = None
    metadata: dict[str, Any] | None = None


def fine_tuning_routes(jobs: JobQueue, model_name: str) -> APIRouter:
    """The routes for jobs on `model_name`, the base this server serves (the only model a job may start from)."""
    router = APIRouter()

    @router.post("/v1/fine_tuning/jobs")
    async def create(body: CreateJob, who: Caller) -> dict[str, Any]:
        if body.model != model_name:
            raise ApiError(404, f"The model '{body.model}' cannot be fine-tuned here: this server fine-tunes "
                                f"'{model_name}', the base it serves.", param="model", code="model_not_found")
        try:
            return await asyncio.to_thread(
                jobs.create, who, model=body.model, training_file=body.training_file,
                validation_file=body.validation_file, method=body.method, hyperparameters=body.hyperparameters,
                suffix=body.suffix, seed=body.seed, metadata=body.metadata)
        except FileNotFound as exc:
            param = "validation_file" if "validation_file" in str(exc) else "training_file"
            raise ApiError(404, str(exc), param=param, code="file_not_found") from None
        except QuotaExceeded as exc:
            raise ApiError(429, str(exc), type="rate_limit_error", code="too_many_jobs") from None
        except ConfigError as exc:
            raise ApiError(400, str(exc), param=_param_named(str(exc)), code="invalid_request") from None

    @router.get("/v1/fine_tuning/jobs")
    async def list_jobs(who: Caller, after: str | None = None, limit: int = 20) -> dict[str, Any]:
        return _page(await asyncio.to_thread(jobs.list_jobs, who), after, limit)

    @router.get("/v1/fine_tuning/jobs/{job_id}")
    async def get_job(job_id: str, who: Caller) -> dict[str, Any]:
        return await _found(jobs.get, who, job_id)

    @router.post("/v1/fine_tuning/jobs/{job_id}/cancel")
    async def cancel(job_id: str, who: Caller) -> dict[str, Any]:
        try:
            return await _found(jobs.cancel, who, job_id)
        except JobFinished as exc:
            raise ApiError(400, str(exc), param="job_id", code="job_finished") from None

    @router.get("/v1/fine_tuning/jobs/{job_id}/events")
    async def events(job_id: str, who: Caller, after: str | None = None, limit: int = 20) -> dict[str, Any]:
        return _page(await _found(jobs.events, who, job_id), after, limit)

    @router.get("/v1/fine_tuning/jobs/{job_id}/checkpoints")
    async def checkpoints(job_id: str, who: Caller, after: str | None = None, limit: int = 10) -> dict[str, Any]:
        return _page(await _found(jobs.checkpoints, who, job_id), after, limit)

    return router


# The request's fields, as a refusal's first word names them (`hyperparameters.n_epochs must be ...`).
_FIELDS = ("hyperparameters", "method", "suffix", "seed", "metadata", "model", "training_file", "validation_file")


def _param_named(message: str) -> str | None:
    """The field a job's refusal is about (`hyperparameters.beta`, `suffix`), for the error's `param`."""
    first = message.split(" ", 1)[0].rstrip(":")
    return first if first.split(".", 1)[0] in _FIELDS else None


def _page(items: list[dict[str, Any]], after: str | None, limit: int) -> dict[str, Any]:
    """OpenAI's cursor page: the items after the one whose id is `after`. An id not in the list is a 400: starting
    over from the newest would send a client paging with a stale cursor round in a loop."""
    if not 1 <= limit <= MAX_LIMIT:
        raise ApiError(400, f"limit: between 1 and {MAX_LIMIT}.", param="limit")
    if after is not None and after not in [str(item["id"]) for item in items]:
        raise ApiError(400, f"after: {after!r} is not in this list; page with an id a previous page gave.",
                       param="after")
    ids = [item["id"] for item in items]
    start = ids.index(after) + 1 if after in ids else 0
    page = items[start:start + limit]
    return {"object": "list", "data": page, "has_more": start + limit < len(items),
            "first_id": page[0]["id"] if page else None, "last_id": page[-1]["id"] if page else None}


async def _found(call: Callable[..., Any], *args: Any) -> Any:
    try:
        return await asyncio.to_thread(call, *args)
    except JobNotFound as exc:
        raise ApiError(404, str(exc), param="job_id", code="job_not_found") from None
