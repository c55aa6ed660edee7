"""The exceptions a user of the bridge can see; all derive from BridgeError.

Errors raised by the estimator on the worker are NOT wrapped: they are
re-raised with their original type (``ValueError`` stays ``ValueError``) and
carry the remote traceback as ``__cause__`` (a :class:`RemoteTraceback`).
"""


class BridgeError(Exception):
    """Base of every error that the bridge itself raises."""


class WorkerUnavailable(BridgeError):
    """No worker answered at the configured address."""


class WorkerLost(BridgeError):
    """The worker stopped answering in the middle of a call."""


class ProtocolError(BridgeError):
    """A message broke the protocol: bad framing, signature or descriptor."""


class VersionMismatch(ProtocolError):
    """Client and worker speak different protocol versions."""


class CacheMiss(BridgeError):
    """The worker no longer holds an array the client sent as "cached" (evicted, or another worker).

    The client answers it by sending the request again with the full data.
    """


class RemoteError(BridgeError):
    """An error on the worker whose type cannot be rebuilt on the client."""


class RemoteTraceback(Exception):
    """Carries the worker's traceback text; set as ``__cause__`` of remote errors."""

    def __init__(self, text):
        super().__init__(text)
        self.text = text

    def __str__(self):
        return f"\n\n--- traceback on the worker ---\n{self.text}"
