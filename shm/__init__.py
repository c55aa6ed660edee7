"""Shared-memory pool used by the client (owner) and the worker (attached)."""

from .pool import (
    SLOT_SIZE,
    Lease,
    Pool,
    PoolAttachment,
    PoolError,
    default_directory,
    pid_alive,
    remove_orphans,
)

__all__ = [
    "SLOT_SIZE",
    "Lease",
    "Pool",
    "PoolAttachment",
    "PoolError",
    "default_directory",
    "pid_alive",
    "remove_orphans",
]
