"""Whose key is this? The one question every route of `gym api` asks first.

Three ways to run a server:
  no keys at all          anyone who can reach it may do everything (one user; bind it to 127.0.0.1)
  --api-key KEY           one shared key, no tenants: the key may do everything
  a store with keys       `gym keys create STORE ...`: each request's Bearer key is looked up in the store's
                          database, on every request (revoking a key takes effect on the next one); a user's key
                          sees the base and that user's variants and files, an admin's sees all. --api-key, if
                          given too, is an admin key.
A store's database counts as keyed from its first key on, revoked keys included, and stays so for the server's life.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends
from starlette.requests import HTTPConnection

from gym.serve.protocol import ApiError
from gym.service.db import Database
from gym.service.keys import ANONYMOUS, Principal, any_keys, authenticate


class Gate:
    def __init__(self, api_key: str | None, db: Database | None) -> None:
        self.api_key = api_key
        self.db = db
        self._keyed = False  # once true, never false again: keys are revoked, never deleted

    @property
    def open(self) -> bool:
        """No key needed right now (the web pages /docs and /redoc, which cannot send one, may be public)."""
        return self.api_key is None and not self.keyed()

    def keyed(self) -> bool:
        if not self._keyed and self.db is not None:
            self._keyed = any_keys(self.db)
        return self._keyed

    def caller(self, request: HTTPConnection) -> Principal:
        """The Principal the request's bearer key stands for; a 401 for a missing, unknown or revoked key."""
        keyed = self.keyed()
        if self.api_key is None and not keyed:
            return ANONYMOUS
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() == "bearer" and token:
            if self.api_key is not None and hmac.compare_digest(token.encode(), self.api_key.encode()):
                return ANONYMOUS
            if keyed:
                assert self.db is not None
                found = authenticate(self.db, token)
                if found is not None:
                    return found
        raise refused()


def caller(request: HTTPConnection) -> Principal:
    """The dependency every route but /health takes: the app's Gate (app.state.gate) asked about this request.
    Sync, so that FastAPI runs the key's database lookup in its threadpool, off the event loop."""
    gate: Gate = request.app.state.gate
    return gate.caller(request)


Caller = Annotated[Principal, Depends(caller)]


def refused() -> ApiError:
    return ApiError(401, "Invalid or missing API key: send 'Authorization: Bearer <key>' with a key that "
                    "has not been revoked.",
                    type="authentication_error", code="invalid_api_key")
