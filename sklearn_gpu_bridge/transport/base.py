"""The transport interface: how a :class:`~sklearn_gpu_bridge.client.Connection` reaches a worker.

A transport carries one request and brings back its reply; it never asks what the request means.
:class:`~.remote.RemoteTransport` speaks ZeroMQ to a worker process (arrays as frames, or in the
shared-memory pool with its fast path); :class:`~.inprocess.InProcessTransport` hands the request to
the worker's operation table in this process. The connection above speaks operations (fit, call,
get_state ...) over whichever it holds.
"""

from abc import ABC, abstractmethod
from collections import Counter

from ..protocol import Capabilities


class Transport(ABC):
    """One client's way to one worker.

    Attributes
    ----------
    capabilities : Capabilities
        What the worker said of itself (backend, float dtype, limits).
    pid : int
        The process that opened it: a forked child opens its own.
    closed : bool
        Set once the transport is closed or its worker is lost.
    process : subprocess.Popen or None
        The local worker this process started, watched while a call waits.
    pool : shm.Pool or None
        The shared-memory pool arrays travel in, where the worker maps it.
    stats : collections.Counter
        Arrays sent and received per path (inline, pool, frame, cached), cache hits.
    """

    capabilities: Capabilities
    process = None
    pool = None
    cache = None

    def __init__(self):
        self.stats = Counter()
        self.closed = False

    @abstractmethod
    def request(self, header, payload=None, *, blobs=None, out_nbytes=0):
        """Send one request and wait for its reply.

        Parameters
        ----------
        header : dict
            The operation and its plain fields (``op``, ``estimator``, ``handle`` ...).
        payload : dict, optional
            Values with arrays (``args``, ``kwargs``), encoded as the transport carries them.
        blobs : dict of bytes, optional
            Opaque byte strings by header field (pickled params, a state).
        out_nbytes : int
            Room to reserve for the reply's arrays.

        Returns
        -------
        (reply, value, buffers)
            The reply header, its decoded payload (None without one) and its raw buffers.
        """

    @abstractmethod
    def roundtrip(self, header, *, timeout=None):
        """A request that carries no arrays (status, get_state): (reply header, its raw buffers).

        ``timeout``: give up after that many seconds; None waits as long as the worker is alive.
        """

    @abstractmethod
    def ping(self, timeout=2.0):
        """True if the worker answers within ``timeout`` seconds, busy or not."""

    def heads_up(self):
        """A request is about to be sent: wake the worker if that helps (nothing by default)."""

    @abstractmethod
    def schedule_release(self, handle):
        """Free ``handle`` on the worker with the next request; called from finalizers, so no I/O."""

    @property
    def last_timing(self):
        """This thread's last request, in seconds: (to the worker, on the worker, back), or None."""
        return None

    @property
    def last_stamps(self):
        """This thread's last request as CLOCK_MONOTONIC stamps: (sent, received, worker's [arrived, replied])."""
        return None

    @abstractmethod
    def close(self):
        """Say goodbye to the worker and release what this transport holds."""

    def retire(self):
        """After the worker was lost: release what is left without talking to it."""
        self.close()
