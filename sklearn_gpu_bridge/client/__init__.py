"""The client side: the bridge's operations over a transport, and this process's own connection."""

from .connection import Connection, Fitted, connect
from .discovery import connection_at_hand, execution_mode, get_connection, heads_up, reset_connection

__all__ = ["Connection", "Fitted", "connect", "connection_at_hand", "execution_mode", "get_connection", "heads_up",
           "reset_connection"]
