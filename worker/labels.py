"""cuML's label encoding of y, done on the host where the labels are their own codes.

A cuML classifier that checks its input with ``check_inputs(..., return_classes=True)``
(LogisticRegression, SVC, RandomForestClassifier, the naive Bayes classifiers, MBSGDClassifier)
encodes y with ``cupy.unique(y, return_inverse=True)``: a sort on the device, a wait for the number
of classes, the classes copied back. For 5000 labels that is 1.5-1.8 ms after a ``gc.collect()`` on
an H100, 0.8-1.1 ms back to back, spent on labels the bridge's client has encoded already
(``_classes_and_codes``): the worker gets the codes 0..k-1, every one of them present. For such a y the answer is known without the device: the classes
are 0..k-1 and the codes are y itself. The worker checks that of y on the host (:func:`own_codes`: a
minimum, a maximum and, for more than two classes, a count; no sort) and only then answers for cuML;
any other y, and one of more than two classes and more than :data:`HOST_MAX_SAMPLES` labels, goes to
cuML's own encoding. The classes, the codes and their dtypes are what cuML's own would be, so the
model fitted is the same.

Only the worker's own process is changed (a user's process that runs cuML keeps it as it is), and
only where cuML's ``check_y`` takes the parameters this answers for, with the defaults it assumes,
and gives the host's answers for a few labels when asked at start; a cuML that differs keeps its own
encoding.
"""

import inspect
import logging
import threading

import numpy as np

from .pinning import to_device

log = logging.getLogger(__name__)

#: labels of more samples and more than two classes are left to the device: the host's count of them grows with
#: them, the device's sort hardly does. On an H100, after a gc.collect() / back to back: 131072 labels 1.4 / 0.6 ms
#: on the host against 2.5 / 2.2 on the device, 1M labels 7.2 / 5.7 against 4.1 / 3.7. Two classes need no
#: count (the least and the greatest label are there), so any number of them is answered here.
HOST_MAX_SAMPLES = 1 << 17
#: the parameters of cuML's check_y that the host's answer depends on, with the defaults it assumes
ASSUMED = {"dtype": None, "mem_type": "device", "order": "A", "return_classes": False, "return_index": False}
ORDERS = ("F", "C", "A", None)  # those check_y takes (any other is its error)
#: the dtype of ``cupy.unique``'s codes (intp), which check_y returns unless asked for another: :data:`PROBES` check it
CODES_DTYPE = np.dtype(np.intp)
#: what a cuML is asked at start (labels, check_y's arguments): it keeps its encoding unless the host answers alike
PROBES = [(np.array([0, 1, 1, 0], np.int32), {"return_classes": True}),
          (np.array([2, 0, 1, 1]), {"return_classes": True, "dtype": ["float32", "float64"]}),
          (np.array([1, 0, 1], np.int32), {"return_classes": True, "dtype": "int32"})]


def own_codes(y):
    """k where ``y`` is a 1-D numpy array of integers holding each of 0..k-1 at least once and nothing else
    (then ``np.unique(y, return_inverse=True)`` is ``(arange(k), y)``); None for anything else, and for more than
    :data:`HOST_MAX_SAMPLES` labels of more than two classes."""
    if (type(y) is not np.ndarray or y.ndim != 1 or not y.size or y.dtype.kind not in "iu"
            or not y.dtype.isnative  # CuPy's copy of it would be native: so are cuML's classes
            or (y.dtype.kind == "u" and y.dtype.itemsize == 8)):  # bincount takes no uint64
        return None
    if y.min() != 0:
        return None
    top = int(y.max())
    if top < 2:  # 0 and top are there: no count needed
        return top + 1
    if (y.size > HOST_MAX_SAMPLES or top >= y.size  # more classes than samples: one is absent
            or not np.bincount(y, minlength=top + 1).all()):
        return None
    return top + 1


class HostLabels:
    """cuML's ``check_y`` answered on the host for labels that are their own codes; ``taken``: how many were."""

    def __init__(self, original):
        self.original = original
        self.taken = 0
        self._lock = threading.Lock()

    def __call__(self, y, *, dtype=None, mem_type="device", order="A", return_classes=False, return_index=False,
                 **kwargs):
        asked_for_codes = return_classes is True and mem_type == "device" and order in ORDERS and not return_index
        n_classes = own_codes(y) if asked_for_codes else None
        if n_classes is None:
            return self.original(y, dtype=dtype, mem_type=mem_type, order=order, return_classes=return_classes,
                                 return_index=return_index, **kwargs)
        # the codes as sent (int32 from the client) go over, and are cast to cuML's intp on the device
        codes = to_device(np.ascontiguousarray(y)).astype(CODES_DTYPE, copy=False)
        if dtype is not None:  # as check_y casts its codes
            wanted = [np.dtype(d) for d in (dtype if isinstance(dtype, (list, tuple)) else [dtype])]
            if codes.dtype not in wanted:
                codes = codes.astype(wanted[0])
        with self._lock:
            self.taken += 1
        return codes, np.arange(n_classes, dtype=y.dtype)


def same_answer(mine, theirs):
    """Whether two answers of ``check_y`` (tuples of arrays) are the same: type, dtype, shape and values."""
    return len(mine) == len(theirs) and all(
        (type(a), a.dtype, a.shape) == (type(b), b.dtype, b.shape) and bool((a == b).all()) for a, b in zip(mine, theirs))


def encode_on_host(validation):
    """Have ``validation`` (``cuml.internals.validation``) answer its ``check_y`` on the host where it can; the
    :class:`HostLabels` that does, or None where this cuML's ``check_y`` is not the one assumed (its parameters,
    its answers to :data:`PROBES`). Installed once per process."""
    current = validation.check_y
    if isinstance(current, HostLabels):
        return current
    try:
        parameters = inspect.signature(current).parameters
    except (TypeError, ValueError):
        parameters = {}
    if any(name not in parameters or parameters[name].default != default for name, default in ASSUMED.items()):
        log.info("cuML's check_y takes other parameters than this worker knows; it encodes labels on the device")
        return None
    host = HostLabels(current)
    try:
        alike = all(same_answer(host(y, **kwargs), current(y, **kwargs)) for y, kwargs in PROBES)
    except Exception as exc:  # noqa: BLE001 - cuML's own encoding stays, said
        log.warning("labels are encoded on the device: asking cuML's check_y failed (%s: %s)", type(exc).__name__, exc)
        return None
    if not alike or host.taken != len(PROBES):
        log.info("cuML's check_y does not answer as this worker would; it encodes labels on the device")
        return None
    host.taken = 0
    validation.check_y = host
    return host
