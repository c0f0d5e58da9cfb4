"""scikit-learn's bundled digits images (1797 8×8 grey images, no download) as float32
arrays ``(N, 1, 8, 8)`` scaled to [0, 1], split into train and test sets. Shared by the
examples; needs ``pip install -e ".[examples]"``."""
import numpy as np

import cuvmap as cv


def load_digits(device="cpu", test_fraction=0.2, seed=0):
    """Returns ``(x_train, y_train, x_test, y_test)`` on ``device``."""
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError as err:  # pragma: no cover - the examples extra installs it
        raise SystemExit('this example needs scikit-learn: pip install -e ".[examples]"') from err
    data = sklearn_digits()
    x = (data.images / 16.0).astype(np.float32)[:, None]
    y = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(test_fraction * len(y)))
    test, train = order[:n_test], order[n_test:]
    return tuple(cv.device_put(a, device) for a in (x[train], y[train], x[test], y[test]))
