"""`gym keys create|list|revoke STORE`: the API keys of `gym api --variants STORE` (gym.service.keys).

Once a store has a key, its server answers only requests that carry one. `create` prints the new key as the last
word of its output (scripts take `| awk '{print $NF}'`); it is shown this once and never stored.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from gym.cli.arguments import CommandParser
from gym.core.errors import ConfigError
from gym.core.files import make_folder
from gym.service.db import Database, open_database
from gym.service.keys import create_key, list_keys, revoke_key


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="gym keys", description="API keys for `gym api --variants STORE`: a user's "
                           "key sees the base and that user's variants and files only; an admin's, all.")
    sub = parser.add_subparsers(dest="verb", required=True)
    c = sub.add_parser("create", help="make a key (printed once, as the last word)")
    c.add_argument("store")
    who = c.add_mutually_exclusive_group(required=True)
    who.add_argument("--user", help="the user id the key acts as (their variant is BASE:USER)")
    who.add_argument("--admin", action="store_true", help="a key that may do everything")
    sub.add_parser("list", help="the store's keys (never the keys themselves)").add_argument("store")
    r = sub.add_parser("revoke", help="revoke a key: refused from the next request on")
    r.add_argument("store")
    r.add_argument("key_id")
    for p in (c, *(sub.choices[name] for name in ("list", "revoke"))):
        p.add_argument("--db", help="a database URL (postgresql://...) instead of STORE/service.db")
    return parser


def _open(store: str, url: str | None, *, create: bool) -> Database:
    root = Path(store).expanduser()
    if create:
        make_folder(root)  # the store, or a folder above it, being a file is one line naming it
    elif not root.is_dir():
        raise ConfigError(f"{store}: no such store (a folder made by `gym variants` or `gym keys create`).")
    return open_database(root, url)


def _when(seconds: int | None) -> str:
    return "-" if seconds is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    db = _open(args.store, args.db, create=args.verb == "create")
    if args.verb == "create":
        info, key = create_key(db, user_id=args.user, admin=args.admin)
        who = "admin" if info.admin else f"user {info.user_id}"
        print(f"Key {info.id} for {who} (shown once; keep it secret): {key}")
        return 0
    if args.verb == "list":
        print("id\twho\tcreated\trevoked")
        for info in list_keys(db):
            who = "admin" if info.admin else f"user:{info.user_id}"
            print(f"{info.id}\t{who}\t{_when(info.created_at)}\t{_when(info.revoked_at)}")
        return 0
    info = revoke_key(db, args.key_id)
    print(f"Revoked {info.id} ({'admin' if info.admin else f'user {info.user_id}'}) at {_when(info.revoked_at)}.")
    return 0
