"""The ZAP handler: who may open a connection to the worker at all.

ZeroMQ asks it about every new connection on a PLAIN or CURVE socket,
during the handshake, before the peer can deliver a single message: a peer
without the credentials (:mod:`sklearn_gpu_bridge.runtime.keys`) costs the worker a
refused handshake, never a parsed or buffered message. pyzmq's own
authenticator does the protocol; this one compares passwords in constant
time, allows the CurveZMQ keys it is given, and counts refusals.
"""

import hmac
import logging
from collections import Counter

from zmq.auth.thread import ThreadAuthenticator

from sklearn_gpu_bridge.runtime.keys import PLAIN_USER

log = logging.getLogger("sklearn_gpu_bridge.worker")
DOMAIN = "sklearn-gpu-bridge"  # the ZAP domain of the worker's socket


class _AllowList:
    """pyzmq's CURVE credentials provider: is this client key allowed?"""

    def __init__(self, keys):
        self.keys = frozenset(keys)

    def callback(self, domain, key):
        return key in self.keys


class Gatekeeper(ThreadAuthenticator):
    """ZAP in a thread of the worker's context: PLAIN with one password, or CURVE with an allow-list."""

    def __init__(self, context, *, password=None, curve_keys=()):
        super().__init__(context, log=log.getChild("zap"))
        self.password = password
        self.curve_keys = curve_keys
        self.refused = Counter()

    def start(self):
        super().start()
        if self.curve_keys:
            self.configure_curve_callback(domain=DOMAIN, credentials_provider=_AllowList(self.curve_keys))
        return self

    def _authenticate_plain(self, domain, username, password):
        ok = username == PLAIN_USER.decode() and hmac.compare_digest(password.encode(), self.password)
        return ok, b"OK" if ok else b"Invalid credentials"

    def _send_zap_reply(self, request_id, status_code, status_text, user_id="anonymous"):
        if status_code != b"200":
            self.refused["handshake"] += 1
        super()._send_zap_reply(request_id, status_code, status_text, user_id)
