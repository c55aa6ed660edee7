"""Shared-memory pool used by the client (owner) and the worker (attached)."""

from .pool import SLOT_SIZE, Block, Pool, PoolAttachment, PoolError, default_directory, remove_orphans

__all__ = ["SLOT_SIZE", "Block", "Pool", "PoolAttachment", "PoolError", "default_directory", "remove_orphans"]
