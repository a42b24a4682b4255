"""API keys: who is calling. A key is bound to one user id (that user's variants and files) or is an admin's.

Keys are 256 random bits (`sk-gym-` + 43 URL-safe characters), shown once when made; the database keeps only
their SHA-256 (a salted slow hash buys nothing for a key no one can guess; the hash only keeps a stolen database
from being a list of working keys). A key is looked up on every request, so revoking one takes effect on the
next request, in every server process that shares the database.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from sqlalchemy import select

from gym.core.errors import ConfigError, GymError
from gym.core.names import check_user_id
from gym.service.db import ApiKey, Database, now

KEY_PREFIX = "sk-gym-"


class KeyNotFound(GymError):
    """A key id that names no key of this store."""


@dataclass(frozen=True)
class Principal:
    """Whose request this is: an admin (everything), or one user (their variants and files, and the base)."""

    user_id: str | None
    admin: bool
    key_id: str | None = None

    def may_see(self, owner: str | None) -> bool:
        """Whether this caller may see a thing `owner` owns (a variant, a file): its owner and admins only."""
        return self.admin or (owner is not None and owner == self.user_id)


ANONYMOUS = Principal(user_id=None, admin=True)  # a server with no keys: one user, who may do everything


@dataclass(frozen=True)
class KeyInfo:
    id: str
    user_id: str | None
    admin: bool
    created_at: int
    revoked_at: int | None


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def create_key(db: Database, *, user_id: str | None = None, admin: bool = False) -> tuple[KeyInfo, str]:
    """A new key for `user_id` (or an admin's): (its record, the key itself, which is not kept anywhere)."""
    if admin == (user_id is not None):
        raise ConfigError("A key is either a user's (--user USER) or an admin's (--admin): give exactly one.")
    if user_id is not None:
        check_user_id(user_id)
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    row = ApiKey(id=f"key_{secrets.token_hex(8)}", key_hash=_hash(key), user_id=user_id, admin=admin,
                 created_at=now())
    with db.session() as session:
        session.add(row)
    return _info(row), key


def list_keys(db: Database) -> list[KeyInfo]:
    with db.session() as session:
        return [_info(row) for row in session.scalars(select(ApiKey).order_by(ApiKey.created_at, ApiKey.id))]


def revoke_key(db: Database, key_id: str) -> KeyInfo:
    """Revoke `key_id` (already revoked: left as it was). The key stops working on the next request."""
    with db.session(write=True) as session:
        row = session.get(ApiKey, key_id)
        if row is None:
            raise KeyNotFound(f"No key {key_id!r} in this store; `gym keys list STORE` shows the ids.")
        if row.revoked_at is None:
            row.revoked_at = now()
        return _info(row)


def any_keys(db: Database) -> bool:
    """Whether this store has ever had a key (revoked ones count: revoking every key must not open the server)."""
    with db.session() as session:
        return session.scalar(select(ApiKey.id).limit(1)) is not None


def authenticate(db: Database, key: str) -> Principal | None:
    """The caller a presented key stands for; None for an unknown or revoked key. The lookup is by the key's hash
    (an index lookup, so its timing says nothing about the key); the stored hash is compared again in constant time."""
    digest = _hash(key)
    with db.session() as session:
        row = session.scalar(select(ApiKey).where(ApiKey.key_hash == digest))
    if row is None or row.revoked_at is not None or not hmac.compare_digest(row.key_hash, digest):
        return None
    return Principal(user_id=row.user_id, admin=row.admin, key_id=row.id)


def _info(row: ApiKey) -> KeyInfo:
    return KeyInfo(id=row.id, user_id=row.user_id, admin=row.admin, created_at=row.created_at,
                   revoked_at=row.revoked_at)
