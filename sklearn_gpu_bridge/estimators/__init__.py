"""The GPU* estimators: scikit-learn estimators whose work runs on the worker.

Each is declared in the module named after its cuML module (see spec.py).
"""

from .cluster import *  # noqa: F403
from .covariance import *  # noqa: F403
from .decomposition import *  # noqa: F403
from .ensemble import *  # noqa: F403
from .kernel_ridge import *  # noqa: F403
from .linear_model import *  # noqa: F403
from .manifold import *  # noqa: F403
from .naive_bayes import *  # noqa: F403
from .neighbors import *  # noqa: F403
from .preprocessing import *  # noqa: F403
from .spec import REGISTRY
from .svm import *  # noqa: F403

__all__ = sorted(REGISTRY)
