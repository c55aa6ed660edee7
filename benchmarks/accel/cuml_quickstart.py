"""The original system's quickstart, unmodified: cuML code on a machine without cuML."""
import cuml
import numpy as np
from cuml.preprocessing import StandardScaler
from cuml.svm import SVC

X = np.random.rand(1000, 20).astype("float32")
y = (X[:, 0] > 0.5).astype("float32")
X_s = StandardScaler().fit_transform(X)
print(SVC(kernel="rbf", C=1.0).fit(X_s, y).predict(X_s[:5]))
print(cuml.__version__)
