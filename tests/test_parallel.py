"""The parallel copy and finite check give exactly what their one-thread forms give."""

import numpy as np
import pytest

from sklearn_gpu_bridge.parallel import PARALLEL_MIN, all_sums_finite, copy_into


@pytest.mark.parametrize("nbytes", [0, 1, PARALLEL_MIN - 1, PARALLEL_MIN * 2 + 7])
def test_copy_into_copies_every_byte(nbytes):
    source = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    target = np.zeros_like(source)
    copy_into(target, source)
    np.testing.assert_array_equal(target, source)


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("rows", [1_000, 1_200_001])  # one thread; chunks on all cores
def test_copy_into_casts_as_astype_does_and_notices_overflow(order, rows):
    source = np.asarray(np.random.default_rng(1).standard_normal((rows, 3)), order=order)
    target = np.empty_like(source, dtype=np.float32, order=order)
    copy_into(target, source)
    np.testing.assert_array_equal(target, source.astype(np.float32))
    source[rows - 1, 1] = 1e300  # in the last chunk
    with pytest.raises(FloatingPointError):
        copy_into(target, source)


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("rows", [1_000, 1_200_001])  # one thread; chunks on all cores
@pytest.mark.parametrize("where", [0, -1, "middle"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_any_nan_or_inf_anywhere_is_found(order, rows, where, value):
    X = np.asarray(np.random.default_rng(0).standard_normal((rows, 4), dtype=np.float32), order=order)
    assert all_sums_finite(X)
    at = rows // 2 if where == "middle" else where
    X[at, 2] = value
    assert not all_sums_finite(X)
