"""The client side: a connection to a worker, and this process's own connection."""

from .connection import Connection, get_connection, heads_up, reset_connection

__all__ = ["Connection", "get_connection", "heads_up", "reset_connection"]
