"""A plain scikit-learn script, unchanged: run as is (CPU) and under `python -m sklearn_gpu_bridge.accel`.

    python benchmarks/accel/sklearn_script.py [--n-jobs N]
"""

import sys
import time

import numpy as np
from sklearn.datasets import make_classification
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC

n_jobs = int(sys.argv[sys.argv.index("--n-jobs") + 1]) if "--n-jobs" in sys.argv else None
X, y = make_classification(20_000, 20, n_informative=10, random_state=0)

start = time.perf_counter()
search = GridSearchCV(Pipeline([("sc", StandardScaler()), ("svm", SVC())]),
                      {"svm__C": [0.1, 1, 10, 100], "svm__gamma": ["scale", 0.01, 0.1]}, cv=3, n_jobs=n_jobs)
search.fit(X, y)
print(f"GridSearchCV(StandardScaler, SVC) 12 x 3 on 20000x20: {time.perf_counter() - start:.2f} s, "
      f"best {search.best_params_}, score {search.best_score_:.4f}")

X, y = make_classification(1_000_000, 50, n_informative=20, random_state=1)
start = time.perf_counter()
model = LogisticRegression(max_iter=1000).fit(X, y)
print(f"LogisticRegression fit 1M x 50 float64: {time.perf_counter() - start:.2f} s, "
      f"accuracy {model.score(X[:100_000], y[:100_000]):.4f}, {type(model).__module__}.{type(model).__name__}")
print("coef checksum", float(np.round(np.abs(model.coef_).sum(), 3)))
