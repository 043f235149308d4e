"""The one way this project runs a sqlite write transaction (spool, history)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def transaction(db: sqlite3.Connection, fn: Callable[[], T]) -> T:
    """Run ``fn`` inside ``BEGIN IMMEDIATE`` (the write lock taken up front, so no upgrade deadlock) on a connection
    opened with ``isolation_level=None``; commit on success, roll back on any exception (a failed COMMIT included),
    cancellation included."""
    db.execute("BEGIN IMMEDIATE")
    try:
        result = fn()
        db.execute("COMMIT")
    except BaseException:
        # A failed COMMIT may leave the transaction open (sqlite rolls back some errors itself, not all): every
        # later BEGIN would then fail with "cannot start a transaction within a transaction".
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return result
