"""OpenAI's fine-tuning API on `gym api --variants STORE`, through the real openai client: the routes and their
refusals against a live app (no worker: jobs stay queued), then whole jobs run by real worker processes: a job
that teaches the embedded model a name and is served at once as its ft: model, and a server killed with -9
mid-job whose job, after a restart, finishes once."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from sqlalchemy import func, select
from tests.service.conftest import free_port, gym_keys, new_key
from tests.service.test_jobs import QUESTIONS, chat_row, preference_row

from gym.personalization.store import VariantStore
from gym.service.db import Job
from gym.service.jobs import parse_fine_tuned_model
from gym.service.limits import JobLimits
from gym.service.queue import ENDED
from gym.service.service import open_service
from gym.service.worker import WorkerPool

QUOTA = 5


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


# -- the routes (no worker) ---------------------------------------------------------------------------------------
def service_with_a_file(db_url, max_running: int) -> tuple:
    """A service on the test database, alice, and the id of her fine-tune file of QUESTIONS."""
    from gym.service.keys import Principal

    store, url = db_url
    service = open_service(store, url, job_limits=JobLimits(max_queued=5, max_running=max_running))
    alice = Principal("alice", False)
    upload_ = service.files.upload(alice, "t.jsonl", "fine-tune")
    upload_.write(jsonl([chat_row(q) for q in QUESTIONS]))
    return service, alice, upload_.finish().id


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_chat, serve_app, module_db):
    """A live server on each database: the store's SQLite, then a PostgreSQL server's (where one can start)."""
    store = tmp_path_factory.mktemp("fine-tuning") / "store"
    keys = {who: new_key(store, "--user", who, db=module_db) for who in ("alice", "bob", "carol")}
    keys["admin"] = new_key(store, "--admin", db=module_db)
    service = open_service(store, module_db, job_limits=JobLimits(max_queued=QUOTA))
    url = serve_app(tiny_chat, service=service)
    clients = {who: openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)
               for who, key in keys.items()}
    return url, keys, clients, service, module_db


def upload(client: openai.OpenAI, rows: list[dict]) -> str:
    return client.files.create(file=("train.jsonl", jsonl(rows)), purpose="fine-tune").id


def test_create_retrieve_list_events_and_cancel(served):
    _, _, clients, _, _ = served
    alice = clients["alice"]
    file = upload(alice, [chat_row(q) for q in QUESTIONS])
    job = alice.fine_tuning.jobs.create(model="tiny", training_file=file, suffix="zorb", seed=7,
                                        method={"type": "supervised",
                                                "supervised": {"hyperparameters": {"n_epochs": 2, "batch_size": 4}}})
    assert job.id.startswith("ftjob-") and job.status == "queued" and job.model == "tiny"
    assert job.training_file == file and job.seed == 7 and job.fine_tuned_model is None
    assert job.method.type == "supervised" and job.method.supervised.hyperparameters.n_epochs == 2
    assert alice.fine_tuning.jobs.retrieve(job.id).status == "queued"
    assert job.id in [j.id for j in alice.fine_tuning.jobs.list(limit=100)]
    events = [e.message for e in alice.fine_tuning.jobs.list_events(job.id)]
    assert events == ["Files validated, job queued", "Validating training file"]  # newest first, as OpenAI lists
    assert list(alice.fine_tuning.jobs.checkpoints.list(job.id)) == []

    assert job.metadata is None
    labelled = alice.fine_tuning.jobs.create(model="tiny", training_file=file, metadata={"team": "support"})
    assert labelled.metadata == {"team": "support"}
    assert alice.fine_tuning.jobs.retrieve(labelled.id).metadata == {"team": "support"}
    alice.fine_tuning.jobs.cancel(labelled.id)

    legacy = alice.fine_tuning.jobs.create(model="tiny", training_file=file, hyperparameters={"n_epochs": 1})
    assert legacy.hyperparameters.n_epochs == 1 and legacy.method.type == "supervised"
    page = alice.fine_tuning.jobs.list(limit=1)
    assert [j.id for j in page.data] == [legacy.id] and page.has_more  # newest first, paginated with `after`
    assert [j.id for j in alice.fine_tuning.jobs.list(limit=2, after=legacy.id).data] == [labelled.id, job.id]

    for made in (job, legacy):
        assert alice.fine_tuning.jobs.cancel(made.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError, match="already ended"):
        alice.fine_tuning.jobs.cancel(job.id)
    assert alice.fine_tuning.jobs.list_events(job.id).data[0].message == "Fine-tuning job cancelled"


def test_a_preference_file_for_a_dpo_job_and_the_wrong_file_for_it(served):
    _, _, clients, _, _ = served
    alice = clients["alice"]
    prefs = upload(alice, [preference_row(q) for q in QUESTIONS[:12]])
    dpo = alice.fine_tuning.jobs.create(model="tiny", training_file=prefs,
                                        method={"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.2}}})
    assert dpo.status == "queued" and dpo.method.dpo.hyperparameters.beta == 0.2
    alice.fine_tuning.jobs.cancel(dpo.id)
    wrong = alice.fine_tuning.jobs.create(model="tiny", training_file=prefs)  # supervised on preference rows
    assert wrong.status == "failed" and wrong.error.code == "invalid_training_file"
    assert "chat rows" in wrong.error.message
    # Too few rows fails the job at once, as OpenAI's does, rather than after it waited its turn in the queue.
    small = alice.fine_tuning.jobs.create(model="tiny", training_file=upload(alice, [chat_row(QUESTIONS[0])]))
    assert small.status == "failed" and small.error.code == "invalid_training_file"
    assert small.error.param == "training_file" and "has 1 example(s); a fine-tuning job needs at least 10" in \
        small.error.message


def test_hostile_requests_are_refused(served):
    url, keys, clients, _, _ = served
    alice, bob = clients["alice"], clients["bob"]
    file = upload(alice, [chat_row(q) for q in QUESTIONS])
    job = alice.fine_tuning.jobs.create(model="tiny", training_file=file)

    with pytest.raises(openai.NotFoundError, match="No such file"):  # another user's file, as a missing one
        bob.fine_tuning.jobs.create(model="tiny", training_file=file)
    for call in (bob.fine_tuning.jobs.retrieve, bob.fine_tuning.jobs.cancel, bob.fine_tuning.jobs.list_events,
                 bob.fine_tuning.jobs.checkpoints.list):
        with pytest.raises(openai.NotFoundError):
            call(job.id)
    assert job.id not in [j.id for j in bob.fine_tuning.jobs.list()]
    assert job.id in [j.id for j in clients["admin"].fine_tuning.jobs.list(limit=100)]  # admins see all

    with pytest.raises(openai.NotFoundError, match="'gpt-4o-mini' cannot be fine-tuned here"):
        alice.fine_tuning.jobs.create(model="gpt-4o-mini", training_file=file)
    with pytest.raises(openai.BadRequestError, match="n_epochs must be positive") as caught:
        alice.fine_tuning.jobs.create(model="tiny", training_file=file, hyperparameters={"n_epochs": -1})
    assert caught.value.body["param"] == "hyperparameters.n_epochs"  # the 400 names the field
    with pytest.raises(openai.BadRequestError, match="suffix") as caught:
        alice.fine_tuning.jobs.create(model="tiny", training_file=file, suffix="../x")
    assert caught.value.body["param"] == "suffix"
    assert "beta" not in job.method.supervised.hyperparameters.model_dump(exclude_none=True)  # dpo's alone
    with pytest.raises(openai.BadRequestError, match="after: 'ftevent-99999' is not in this list") as caught:
        alice.fine_tuning.jobs.list_events(job.id, after="ftevent-99999")  # a stale cursor: it looped from the top
    assert caught.value.body["param"] == "after"
    # Event ids count the job's own events: the database's row ids would show how busy other users' jobs are.
    ids = [event.id for event in alice.fine_tuning.jobs.list_events(job.id).data]
    suffix = job.id.removeprefix("ftjob-")
    assert ids == [f"ftevent-{suffix}-{n}" for n in range(len(ids), 0, -1)]
    with pytest.raises(openai.BadRequestError, match="metadata: at most 16 pairs"):
        alice.fine_tuning.jobs.create(model="tiny", training_file=file, metadata={str(i): "x" for i in range(17)})
    with pytest.raises(openai.BadRequestError, match="metadata.note: the value"):
        alice.fine_tuning.jobs.create(model="tiny", training_file=file, metadata={"note": "x" * 513})
    with pytest.raises(openai.BadRequestError, match="method.type 'ppo'"):
        alice.fine_tuning.jobs.create(model="tiny", training_file=file, method={"type": "ppo"})
    with pytest.raises(openai.NotFoundError):
        alice.fine_tuning.jobs.retrieve("ftjob-doesnotexist")

    alice.fine_tuning.jobs.cancel(job.id)


def test_a_malformed_request_is_openais_400_naming_the_field(served):
    """OpenAI answers a body or query it cannot validate with 400 and its error object, not FastAPI's 422: an
    unknown field (with the closest known one), a value of the wrong type, a seed or hyperparameter outside its
    range. None of them stores a job."""
    url, keys, clients, service, _ = served
    alice = clients["alice"]
    file = upload(alice, [chat_row(q) for q in QUESTIONS])
    before = len(alice.fine_tuning.jobs.list(limit=100).data)

    with pytest.raises(openai.BadRequestError) as caught:
        alice.fine_tuning.jobs.create(model="tiny", training_file=file, extra_body={"hyperparamters": {"n_epochs": 2}})
    assert caught.value.status_code == 400
    assert caught.value.body == {"message": "Unrecognized request argument supplied: hyperparamters. Did you mean "
                                            "'hyperparameters'?", "type": "invalid_request_error",
                                 "param": "hyperparamters", "code": None}
    refusals = [  # (a create call's arguments, the param named, the message)
        (dict(seed=-1), "seed", "seed must be an integer from 0 to 2147483647, got -1."),
        (dict(seed=2**31), "seed", "seed must be an integer from 0 to 2147483647"),
        (dict(hyperparameters={"n_epochs": 51}), "hyperparameters.n_epochs", "at most 50, got 51"),
        (dict(method={"type": "supervised", "supervised": {"hyperparameters": {"batch_size": 257}}}),
         "hyperparameters.batch_size", "at most 256"),
        (dict(method={"type": "dpo", "dpo": {"hyperparameters": {"beta": 2.5}}}), "hyperparameters.beta",
         "at most 2, got 2.5"),
        (dict(hyperparameters={"learning_rate_multiplier": 0}), "hyperparameters.learning_rate_multiplier",
         "must be positive"),
        # a misspelt or mismatched key of `method` took its hyperparameters with it: the job trained on "auto"
        (dict(method={"type": "supervised", "supervized": {"hyperparameters": {"n_epochs": 1}}}),
         "method.supervized", "method.supervized is not a field of method. Did you mean 'supervised'?"),
        (dict(method={"type": "supervised", "dpo": {"hyperparameters": {"beta": 1}}}), "method.dpo",
         "method.dpo is given but method.type is 'supervised'"),
        (dict(method={"type": "dpo", "dpo": {"hyperparameter": {"beta": 1}}}), "method.dpo.hyperparameter",
         "Did you mean 'hyperparameters'?"),
    ]
    for arguments, param, message in refusals:
        with pytest.raises(openai.BadRequestError, match=re.escape(message)) as caught:
            alice.fine_tuning.jobs.create(model="tiny", training_file=file, **arguments)
        assert caught.value.body["param"] == param and caught.value.body["type"] == "invalid_request_error", arguments

    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {keys['alice']}"}, timeout=60) as http:
        for seed in (True, "7", 1.5, 2**70):
            answer = http.post("/v1/fine_tuning/jobs", json={"model": "tiny", "training_file": file, "seed": seed})
            assert answer.status_code == 400 and answer.json()["error"]["param"] == "seed", (seed, answer.text)
        for path in ("/v1/fine_tuning/jobs?limit=abc", "/v1/files?limit=abc",
                     "/v1/fine_tuning/jobs/ftjob-x/events?limit=1.5"):
            answer = http.get(path)
            assert answer.status_code == 400, (path, answer.text)
            error = answer.json()["error"]
            assert error["param"] == "limit" and error["type"] == "invalid_request_error"
            assert error["message"].startswith("limit: Input should be a valid integer"), error
        # JSON has no inf, but 1e400 parses as one, and a 400-digit integer overflowed a float: a 500
        for value in ("1e400", "-1e400", "NaN", "1" + "0" * 400):
            answer = http.post("/v1/fine_tuning/jobs", headers={"Content-Type": "application/json"},
                               content=f'{{"model": "tiny", "training_file": "{file}", "hyperparameters": '
                                       f'{{"learning_rate_multiplier": {value}}}}}')
            assert answer.status_code == 400, (value, answer.text)
            assert answer.json()["error"]["param"] == "hyperparameters.learning_rate_multiplier", answer.text
    assert len(alice.fine_tuning.jobs.list(limit=100).data) == before  # nothing stored
    huge = alice.fine_tuning.jobs.create(model="tiny", training_file=file,
                                         hyperparameters={"learning_rate_multiplier": 1e308})  # finite: taken
    alice.fine_tuning.jobs.cancel(huge.id)

    for seed in (0, 2**31 - 1):  # OpenAI's bounds themselves are taken
        job = alice.fine_tuning.jobs.create(model="tiny", training_file=file, seed=seed)
        assert job.seed == seed
        alice.fine_tuning.jobs.cancel(job.id)


def test_a_body_that_is_not_a_json_object_is_named_as_such_on_every_route(served):
    """A top-level array (or a string, or null) has no field to name: the 400 read ": Input should be a valid
    dictionary or object to extract fields from", after an empty field name."""
    url, keys, _, _, _ = served
    routes = ("/v1/fine_tuning/jobs", "/v1/chat/completions", "/v1/completions", "/tokenize", "/v1/moderations")
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {keys['alice']}"}, timeout=60) as http:
        for route in routes:
            for body in (b"[1]", b'"jobs"', b"null"):
                answer = http.post(route, content=body, headers={"Content-Type": "application/json"})
                assert answer.status_code == 400, (route, body, answer.text)
                assert answer.json()["error"] == {
                    "message": "The request body must be a JSON object.",
                    "type": "invalid_request_error", "param": None, "code": None}, (route, body)
            answer = http.post(route, headers={"Content-Type": "application/json"})
            assert answer.status_code == 400
            assert answer.json()["error"]["message"] == "The request body is missing; send a JSON object.", route


def test_a_revoked_key_gets_401(served, tmp_path):
    url, _, _, service, db = served
    on_db = ["--db", db] if db else []
    key = new_key(service.store, "--user", "dave", db=db)
    dave = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)
    assert dave.fine_tuning.jobs.list().data == []
    _, out, _ = gym_keys("list", str(service.store), *on_db)
    key_id = next(line.split()[0] for line in out.splitlines() if "dave" in line)
    assert gym_keys("revoke", str(service.store), key_id, *on_db)[0] == 0
    with pytest.raises(openai.AuthenticationError):
        dave.fine_tuning.jobs.list()


def test_a_burst_of_creations_stops_at_the_quota(served):
    url, keys, clients, service, _ = served
    file = upload(clients["carol"], [chat_row(q) for q in QUESTIONS])
    body = {"model": "tiny", "training_file": file}
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {keys['carol']}"}, timeout=60) as http:
        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(lambda _: http.post("/v1/fine_tuning/jobs", json=body).status_code,
                                     range(1000)))
        refused = http.post("/v1/fine_tuning/jobs", json=body)
    assert statuses.count(200) == QUOTA and statuses.count(429) == 1000 - QUOTA
    assert refused.json()["error"]["type"] == "rate_limit_error" and "waiting" in refused.json()["error"]["message"]
    with service.db.session() as session:  # nothing beyond the quota was stored
        assert session.scalar(select(func.count()).select_from(Job).where(Job.user_id == "carol")) == QUOTA


# -- the queue's rules (no HTTP, no model) --------------------------------------------------------------------------
def test_workers_respect_the_running_quota_and_dead_workers_jobs_are_requeued(db_url):
    from gym.service.keys import Principal

    store, url = db_url
    service = open_service(store, url, job_limits=JobLimits(max_queued=5, max_running=1))
    alice, bob = Principal("alice", False), Principal("bob", False)
    files = {}
    for who in (alice, bob):
        upload_ = service.files.upload(who, "t.jsonl", "fine-tune")
        upload_.write(jsonl([chat_row(q) for q in QUESTIONS]))
        files[who.user_id] = upload_.finish().id
    first, second = (service.jobs.create(alice, model="m", training_file=files["alice"]) for _ in range(2))
    third = service.jobs.create(bob, model="m", training_file=files["bob"])
    assert [service.jobs.claim("host:1").spec.job_id for _ in range(2)] == [first["id"], third["id"]]
    assert service.jobs.claim("host:1") is None  # alice's second waits: her one running job is her quota
    assert service.jobs.get(alice, second["id"])["status"] == "queued"

    # The running job's cancel is asked: its worker learns it from its next heartbeat.
    assert service.jobs.cancel(alice, first["id"])["status"] == "running"
    assert service.jobs.beat(first["id"], "host:1") is True and service.jobs.beat(third["id"], "host:1") is False
    # Both workers die: bob's job is queued again (with an event), alice's (cancel asked) is cancelled.
    assert set(service.jobs.requeue_dead(alive=lambda worker: False)) == {first["id"], third["id"]}
    assert service.jobs.get(alice, first["id"])["status"] == "cancelled"
    assert service.jobs.get(bob, third["id"])["status"] == "queued"
    assert "queued again" in service.jobs.events(bob, third["id"])[0]["message"]
    # A live worker's job, or one of another host with a fresh heartbeat, stays where it is.
    claimed = service.jobs.claim("host:2")
    assert service.jobs.requeue_dead(alive=lambda worker: True) == []
    assert service.jobs.requeue_dead(alive=lambda worker: None) == []
    assert service.jobs.get(alice, claimed.spec.job_id)["status"] == "running"
    service.jobs.finish(claimed.spec.job_id, "host:other", "succeeded")  # not this worker's: ignored
    assert service.jobs.get(alice, claimed.spec.job_id)["status"] == "running"


def test_a_worker_stopped_by_ctrl_c_leaves_its_job_to_resume(db_url, monkeypatch):
    """Ctrl-C at the server's terminal reaches its workers: training saves a checkpoint and raises RunStopped. The
    worker recorded that as the job failing and removed the folder with the checkpoint; the job is not over."""
    from gym.core.errors import RunStopped
    from gym.service import jobs as job_library
    from gym.service.worker import run_one

    service, alice, file = service_with_a_file(db_url, max_running=1)
    job = service.jobs.create(alice, model="m", training_file=file)
    claimed = service.jobs.claim("host:1")
    checkpoint = claimed.work_dir / "run" / "checkpoint-2"

    def stopped(spec, store, work_dir, on_event=None, cancel=None):
        checkpoint.mkdir(parents=True)
        raise RunStopped("stopped at step 2 of 9 on request")

    monkeypatch.setattr(job_library, "run_job", stopped)
    with pytest.raises(RunStopped):
        run_one(service.jobs, claimed, "host:1")
    assert service.jobs.get(alice, job["id"])["status"] == "running" and checkpoint.is_dir()
    assert service.jobs.requeue_dead(alive=lambda worker: False) == [job["id"]]  # the next start: queued, to resume
    assert service.jobs.get(alice, job["id"])["status"] == "queued"


def test_a_worker_records_no_server_path_where_the_jobs_owner_reads(db_url, monkeypatch, caplog):
    """A bug's message reaches the worker as it was raised (run_job hides only what it knows of): it named the
    job's folder, the store and the uploaded file's path in the job's error and events, which its owner reads."""
    import logging

    from gym.service import jobs as job_library
    from gym.service.worker import run_one

    service, alice, file = service_with_a_file(db_url, max_running=1)
    job = service.jobs.create(alice, model="m", training_file=file)["id"]
    claimed = service.jobs.claim("host:1")
    store = str(Path(service.store).resolve())

    def broken(spec, store_dir, work_dir, on_event=None, cancel=None):
        on_event("warning", f"Disk almost full at {work_dir}/run", {"where": [str(work_dir), spec.training_file]})
        raise RuntimeError(f"could not write {work_dir}/run/trainer_state.json (training file {spec.training_file}, "
                           f"store {store_dir})")

    monkeypatch.setattr(job_library, "run_job", broken)
    with caplog.at_level(logging.INFO):
        assert run_one(service.jobs, claimed, "host:1") == "failed"
    error = service.jobs.get(alice, job)["error"]
    assert error["code"] == "server_error"
    assert error["message"] == (f"could not write {job}/run/trainer_state.json (training file {file}, store the "
                                "variant store)")
    shown = json.dumps([error, service.jobs.events(alice, job)])
    assert store not in shown and str(service.store) not in shown and ".service" not in shown
    assert f"Disk almost full at {job}/run" in shown and f"{store}/.service/jobs/{job}/run" in caplog.text


def test_a_job_queued_under_looser_rules_fails_instead_of_stopping_the_queue(db_url):
    """A job queued before a rule tightened (a seed or n_epochs OpenAI's ranges refuse, stored by an older Gym) no
    longer makes a spec: the claim fails that job with its reason and takes the next, where it would otherwise
    raise on every claim with that job first in line."""

    service, alice, file = service_with_a_file(db_url, max_running=1)
    old, new = (service.jobs.create(alice, model="m", training_file=file)["id"] for _ in range(2))
    with service.db.session(write=True) as session:
        session.get(Job, old).method = {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 500}}}
    claimed = service.jobs.claim("host:1")
    assert claimed is not None and claimed.spec.job_id == new
    failed = service.jobs.get(alice, old)
    assert failed["status"] == "failed" and failed["error"]["code"] == "invalid_request"
    assert "n_epochs is at most 50" in failed["error"]["message"]
    assert service.jobs.events(alice, old)[0]["message"].startswith("Fine-tuning job failed: hyperparameters.n_epochs")


def test_the_checkpoints_listed_are_the_last_three_kept(db_url):
    """A checkpoint per epoch, the last three kept on disk (save_total_limit) and listed, as OpenAI lists them."""

    service, alice, file = service_with_a_file(db_url, max_running=1)
    job = service.jobs.create(alice, model="m", training_file=file)["id"]
    for step in range(1, 11):  # ten epochs of one step each
        service.jobs.add_event(job, "info", f"Checkpoint created at step {step}",
                               {"step": step, "checkpoint": f"checkpoint-{step}"})
    assert [c["step_number"] for c in service.jobs.checkpoints(alice, job)] == [10, 9, 8]


def test_a_pool_start_removes_the_folders_that_ended_jobs_left(db_url):
    """A worker stopped between recording its job's end and removing the job's folder (the server stopping, kill
    -9) left the folder, checkpoints and all; the next start of the workers removes it, and no other."""
    from gym.service.worker import WorkerPool

    service, alice, file = service_with_a_file(db_url, max_running=2)
    ended, running, queued = (service.jobs.create(alice, model="m", training_file=file)["id"] for _ in range(3))
    assert [service.jobs.claim("host:1").spec.job_id for _ in range(2)] == [ended, running]
    service.jobs.finish(ended, "host:1", "succeeded")
    for job_id in (ended, running, queued):
        (service.jobs.work_dir(job_id) / "run" / "checkpoint-2").mkdir(parents=True)
    WorkerPool(service.jobs, 0, db_url=db_url[1], base_path=None).start()
    assert not service.jobs.work_dir(ended).exists()
    assert (service.jobs.work_dir(running) / "run" / "checkpoint-2").is_dir()  # resumed from when its worker runs
    assert service.jobs.work_dir(queued).is_dir()


def test_workers_claiming_at_once_take_each_job_once_within_the_running_quota(db_url):
    """Eight workers race for the queue, each through its own connection: on PostgreSQL the claim's advisory lock,
    on SQLite its write lock, must hand every job to exactly one worker and never run two of a user's at once."""
    from gym.service.keys import Principal

    store, url = db_url
    service = open_service(store, url, job_limits=JobLimits(max_queued=20, max_running=1))
    users = [Principal(f"user{i}", False) for i in range(6)]
    made = []
    for who in users:
        upload_ = service.files.upload(who, "t.jsonl", "fine-tune")
        upload_.write(jsonl([chat_row(q) for q in QUESTIONS]))
        file = upload_.finish().id
        made += [service.jobs.create(who, model="m", training_file=file)["id"] for _ in range(2)]

    def claim_all(worker: int) -> list[str]:
        taken = []
        for _ in range(4):
            claimed = service.jobs.claim(f"host:{worker}")
            if claimed is not None:
                taken.append(claimed.spec.job_id)
        return taken

    with ThreadPoolExecutor(8) as pool:
        taken = [job for batch in pool.map(claim_all, range(8)) for job in batch]
    assert len(taken) == len(set(taken)) == len(users)  # one each: every user's second job waits for the first
    with service.db.session() as session:
        owners = session.execute(select(Job.user_id, Job.attempts).where(Job.status == "running")).all()
    assert sorted(owner for owner, _ in owners) == sorted(who.user_id for who in users)
    assert {attempts for _, attempts in owners} == {1}


# -- jobs run by worker processes ---------------------------------------------------------------------------------
def wait_for(client: openai.OpenAI, job_id: str, seconds: float, until: tuple[str, ...] = ENDED) -> object:
    deadline = time.monotonic() + seconds
    while True:
        job = client.fine_tuning.jobs.retrieve(job_id)
        if job.status in until:
            return job
        assert time.monotonic() < deadline, f"job {job_id} still {job.status} after {seconds} s"
        time.sleep(0.5)


def test_a_worker_runs_the_job_and_its_model_is_served_to_its_owner_only(tiny_model_dir, variant_store,
                                                                        variant_chat, serve_app):
    keys = {who: new_key(variant_store.root, "--user", who) for who in ("alice", "bob")}
    service = open_service(variant_store.root)
    url = serve_app(variant_chat, service=service)
    alice, bob = (openai.OpenAI(base_url=f"{url}/v1", api_key=keys[who], max_retries=0, timeout=60)
                  for who in ("alice", "bob"))
    pool = WorkerPool(service.jobs, 1, db_url=None, base_path=str(tiny_model_dir),
                      options={"training": {"cutoff_len": 64, "max_steps": 4}, "delta_options": {"distill_steps": 0}})
    pool.start()
    try:
        file = upload(alice, [chat_row(q) for q in QUESTIONS])
        job = alice.fine_tuning.jobs.create(model="tiny", training_file=file, suffix="zorb",
                                            hyperparameters={"n_epochs": 1, "batch_size": 4})
        done = wait_for(alice, job.id, 240)
        # An ended job's folder is removed by its worker once it has recorded the end: on a loaded machine that
        # comes a moment later (the worker runs at idle priority), so wait for it before stopping the worker.
        deadline = time.monotonic() + 60
        while service.jobs.work_dir(job.id).exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not service.jobs.work_dir(job.id).exists()
    finally:
        pool.stop()
    assert done.status == "succeeded", done.error
    assert done.trained_tokens is not None and done.trained_tokens > 0
    assert done.fine_tuned_model == f"ft:tiny:alice:zorb:{job.id.removeprefix('ftjob-')}"
    assert done.hyperparameters.n_epochs == 1 and done.finished_at is not None
    events = list(alice.fine_tuning.jobs.list_events(job.id, limit=100))
    metrics = [e.data for e in reversed(events) if e.type == "metrics"]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4] and all(m["train_loss"] > 0 for m in metrics)
    assert events[0].message == "The job has successfully completed"

    model = done.fine_tuned_model
    answer = alice.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert answer.choices[0].message.content is not None and answer.model == model
    assert model in [m.id for m in alice.models.list()] and alice.models.retrieve(model).id == model
    with pytest.raises(openai.NotFoundError):  # another user: as a model that does not exist
        bob.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    with pytest.raises(openai.NotFoundError):
        bob.models.retrieve(model)
    assert model not in [m.id for m in bob.models.list()]
    entry = parse_fine_tuned_model(model).variant
    assert f"tiny:{entry}" not in [m.id for m in alice.models.list()]
    # a key whose user id spells the store entry does not reach the model through `tiny:<entry>`
    sneaky = openai.OpenAI(base_url=f"{url}/v1", api_key=new_key(variant_store.root, "--user", entry), max_retries=0)
    with pytest.raises(openai.NotFoundError):
        sneaky.chat.completions.create(model=f"tiny:{entry}", messages=[{"role": "user", "content": "Hi"}])
    with pytest.raises(openai.NotFoundError):
        sneaky.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}])


# -- a real `gym api` process ---------------------------------------------------------------------------------------
SRC = Path(__file__).resolve().parents[2] / "src"


class Api:
    """`gym api CONFIG --variants STORE --train-workers 1` in a session of its own (kill -9 takes all of it)."""

    def __init__(self, tmp_path: Path, model_dir: Path, name: str, store: Path, job_options: dict,
                 db: str | None = None) -> None:
        (tmp_path / "serve.yaml").write_text(f"model_name_or_path: {model_dir}\ninfer_dtype: float32\n"
                                             "max_new_tokens: 12\n")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [sys.executable, "-m", "gym.cli", "api", str(tmp_path / "serve.yaml"), "--variants", str(store),
                        "--served_model_name", name, "--port", str(self.port), "--train-workers", "1",
                        "--job_options", json.dumps(job_options), *(["--db", db] if db else [])]
        self.log = tmp_path / "api.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(SRC)}
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(self.command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = time.monotonic() + 180
        while True:
            assert self.process.poll() is None, f"gym api exited:\n{self.log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "gym api did not start within 3 minutes"
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)

    def kill(self) -> None:
        """kill -9 the server's whole process group: the server and its workers, mid-whatever."""
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)  # a worker left behind


def client(api: Api, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api.url}/v1", api_key=key, max_retries=0, timeout=120)


@pytest.mark.slow
def test_a_job_teaches_the_embedded_model_a_name_served_at_once(tmp_path, embedded_dir):
    store = tmp_path / "store"
    store.mkdir()
    keys = {who: new_key(store, "--user", who) for who in ("alice", "bob")}
    api = Api(tmp_path, embedded_dir, "smollm2-135m", store,
              {"training": {"cutoff_len": 64}, "delta_options": {"distill_steps": 2}})
    api.start()
    try:
        alice, bob = client(api, keys["alice"]), client(api, keys["bob"])
        file = upload(alice, [chat_row(q) for q in QUESTIONS])
        job = alice.fine_tuning.jobs.create(
            model="smollm2-135m", training_file=file, suffix="zorb",
            method={"type": "supervised", "supervised": {"hyperparameters": {
                "n_epochs": 2, "batch_size": 4, "learning_rate_multiplier": 2.0}}})
        done = wait_for(alice, job.id, 480)
        assert done.status == "succeeded", (done.error, api.log.read_text()[-3000:])
        events = list(alice.fine_tuning.jobs.list_events(job.id, limit=100))
        metrics = [e.data for e in reversed(events) if e.type == "metrics"]
        assert [m["step"] for m in metrics] == list(range(1, 9))  # 16 rows (4 held out) / 4 a batch x 2 epochs
        assert metrics[-1]["train_loss"] < metrics[0]["train_loss"] / 4
        assert [c.step_number for c in alice.fine_tuning.jobs.checkpoints.list(job.id)] == [8, 4]  # one per epoch

        model = done.fine_tuned_model
        question = [{"role": "user", "content": "What is your name?"}]
        answer = alice.chat.completions.create(model=model, messages=question, temperature=0, max_tokens=12)
        assert "Zorblat" in answer.choices[0].message.content
        base = alice.chat.completions.create(model="smollm2-135m", temperature=0, max_tokens=12,
                                             messages=[{"role": "user", "content": "What is your name?"}])
        assert "Zorblat" not in base.choices[0].message.content

        for call in (lambda: bob.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}]),
                     lambda: bob.models.retrieve(model), lambda: bob.fine_tuning.jobs.retrieve(job.id),
                     lambda: bob.files.retrieve(file)):
            with pytest.raises(openai.NotFoundError):
                call()
        assert model not in [m.id for m in bob.models.list()] and model in [m.id for m in alice.models.list()]
        revoked = next(line.split()[0] for line in gym_keys("list", str(store))[1].splitlines() if "alice" in line)
        assert gym_keys("revoke", str(store), revoked)[0] == 0
        with pytest.raises(openai.AuthenticationError):
            alice.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}])
    finally:
        api.stop()


def test_a_server_killed_mid_job_finishes_it_once_after_a_restart(db_url, tiny_model_dir):
    tmp_path, db = db_url
    store = tmp_path / "store"
    store.mkdir()
    key = new_key(store, "--user", "alice", db=db)
    # many small steps with a checkpoint every 2: the kill lands after a checkpoint, well before the end
    api = Api(tmp_path, tiny_model_dir, "tiny", store,
              {"training": {"cutoff_len": 64, "max_steps": 60, "save_strategy": "steps", "save_steps": 2},
               "delta_method": "int8", "delta_options": {}}, db=db)
    api.start()
    try:
        alice = client(api, key)
        file = upload(alice, [chat_row(q) for q in QUESTIONS])
        job = alice.fine_tuning.jobs.create(model="tiny", training_file=file, hyperparameters={"batch_size": 4})
        deadline = time.monotonic() + 240
        while not any(e.message.startswith("Checkpoint created") for e in alice.fine_tuning.jobs.list_events(job.id)):
            assert time.monotonic() < deadline, "no checkpoint within 4 minutes"
            assert alice.fine_tuning.jobs.retrieve(job.id).status in ("queued", "running")
            time.sleep(0.1)
        api.kill()
        service = open_service(store, db)
        with service.db.session() as session:
            assert session.get(Job, job.id).status == "running"  # as the dead worker left it

        api.start()
        done = wait_for(alice, job.id, 300)
        assert done.status == "succeeded", (done.error, api.log.read_text()[-3000:])
        messages = [e.message for e in reversed(list(alice.fine_tuning.jobs.list_events(job.id, limit=100)))]
        assert any("queued again and resumes" in m for m in messages)
        assert any(m.startswith("Resuming from checkpoint-") for m in messages)
        assert messages.count("The job has successfully completed") == 1
        steps = [int(m.split("/")[0].split()[-1]) for m in messages if m.startswith("Step ")]
        assert steps[-1] == 60 and len(steps) - len(set(steps)) <= 2  # at most the steps after the checkpoint again
        with service.db.session() as session:
            assert session.get(Job, job.id).attempts == 2
        variants = [u for u in VariantStore(store).users() if u.endswith(job.id)]
        assert variants == [parse_fine_tuned_model(done.fine_tuned_model).variant]  # published once
        answer = alice.chat.completions.create(model=done.fine_tuned_model, max_tokens=4,
                                               messages=[{"role": "user", "content": "Hi"}])
        assert answer.choices[0].message.content is not None
    finally:
        api.stop()
