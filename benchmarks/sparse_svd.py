"""TruncatedSVD on sparse (TF-IDF-like) X through the bridge on a cuML worker, against scikit-learn on the CPU.

Prints:
1. 20k x 5k TF-IDF-like CSR (1% dense), 100 components: explained_variance_ratio_.sum() of GPUTruncatedSVD
   (cuML worker: randomized SVD on the GPU), of GPUTruncatedSVD's arpack-like setting through accel's parameters
   (algorithm='arpack'), of scikit-learn randomized, against scikit-learn arpack (the 1% goal);
2. ROWS x 100k TF-IDF-like CSR at 0.1% density (ROWS: argv[1], default 300000; 1M rows makes scikit-learn's CPU
   fit take minutes, past this script's 60 s), 100 components: seconds of GPUTruncatedSVD.fit_transform through
   the bridge (sending X included, after one warm-up fit) and of scikit-learn randomized on this CPU, and the
   explained variance of each.

Run with PYTHONPATH holding cuML and this package: python benchmarks/sparse_svd.py [ROWS]
"""

import sys
import time

import numpy as np
import scipy.sparse as sp


def tfidf_like(n_docs, n_terms, density, n_topics=50, seed=0, dtype=np.float32):
    """Documents of Zipf-distributed words, half shared, half from the document's topic; TF-IDF, rows l2-normed."""
    rng = np.random.default_rng(seed)
    per_row = max(1, round(density * n_terms))
    nnz = n_docs * per_row
    ranks = (np.exp(rng.random(nnz, dtype=np.float32) * np.float32(np.log(n_terms))) - 1).astype(np.int64)
    shift = rng.integers(0, n_terms, n_topics)
    own = rng.random(nnz, dtype=np.float32) < 0.5
    cols = np.where(own, (ranks + np.repeat(shift[rng.integers(0, n_topics, n_docs)], per_row)) % n_terms, ranks)
    X = sp.csr_matrix((np.ones(nnz, dtype=dtype), cols.astype(np.int32), np.arange(0, nnz + 1, per_row)),
                      shape=(n_docs, n_terms))
    X.sum_duplicates()  # counts
    df = np.bincount(X.indices, minlength=n_terms)
    idf = (np.log((1 + n_docs) / (1 + df)) + 1).astype(dtype)
    X.data = np.log1p(X.data) * idf[X.indices]
    norms = np.sqrt(np.add.reduceat(X.data.astype(np.float64) ** 2, X.indptr[:-1])).astype(dtype)
    X.data /= np.repeat(norms, np.diff(X.indptr))
    return X


def main():
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 300_000
    from sklearn.decomposition import TruncatedSVD

    import sklearn_gpu_bridge
    from sklearn_gpu_bridge import GPUTruncatedSVD

    start = time.perf_counter()
    sklearn_gpu_bridge.set_config(local_backend="cuml")
    GPUTruncatedSVD(n_components=2).fit(tfidf_like(1000, 500, 0.02))  # starts the worker, warms CuPy
    print(f"worker started and warm in {time.perf_counter() - start:.1f} s")

    X = tfidf_like(20_000, 5_000, 0.01)
    print(f"\n1. {X.shape[0]} x {X.shape[1]} TF-IDF-like CSR, {X.nnz} values, 100 components")
    arpack = TruncatedSVD(100, algorithm="arpack", random_state=0).fit(X.astype(np.float64))
    want = arpack.explained_variance_ratio_.sum()
    print(f"   scikit-learn arpack          explained variance ratio sum {want:.6f}")
    cases = {
        "scikit-learn randomized": TruncatedSVD(100, random_state=0),
        "bridge GPUTruncatedSVD": GPUTruncatedSVD(n_components=100, random_state=0),
        "bridge, sklearn's 'arpack'": _accel_like(100, "arpack"),
    }
    for label, model in cases.items():
        t = time.perf_counter()
        model.fit(X)
        got = model.explained_variance_ratio_.sum()
        sv = np.max(np.abs(model.singular_values_ / arpack.singular_values_ - 1))
        print(f"   {label:<28} explained variance ratio sum {got:.6f} ({100 * (got / want - 1):+.3f}% of arpack's; "
              f"singular values within {sv:.1e}) in {time.perf_counter() - t:.2f} s")

    t = time.perf_counter()
    X = tfidf_like(rows, 100_000, 0.001)
    print(f"\n2. {X.shape[0]} x {X.shape[1]} TF-IDF-like CSR at 0.1%: {X.nnz} values "
          f"({(X.data.nbytes + X.indices.nbytes + X.indptr.nbytes) / 1e9:.2f} GB), built in "
          f"{time.perf_counter() - t:.1f} s; 100 components")
    bridged = GPUTruncatedSVD(n_components=100, random_state=0)
    t = time.perf_counter()
    reduced = bridged.fit_transform(X)
    gpu = time.perf_counter() - t
    gpu_ratio = bridged.explained_variance_ratio_.sum()
    print(f"   bridge GPUTruncatedSVD.fit_transform (cuML worker): {gpu:.2f} s, "
          f"explained variance ratio sum {gpu_ratio:.5f}, output {reduced.shape}")
    t = time.perf_counter()
    direct = TruncatedSVD(n_components=100, random_state=0)
    direct.fit_transform(X)
    cpu = time.perf_counter() - t
    cpu_ratio = direct.explained_variance_ratio_.sum()
    print(f"   scikit-learn randomized on the CPU:                 {cpu:.2f} s, "
          f"explained variance ratio sum {cpu_ratio:.5f}")
    print(f"   speed-up {cpu / gpu:.1f}x; explained variance {100 * (gpu_ratio / cpu_ratio - 1):+.3f}% of "
          f"scikit-learn's; singular values within "
          f"{np.max(np.abs(bridged.singular_values_ / direct.singular_values_ - 1)):.1e}")
    print(f"\ntotal {time.perf_counter() - start:.1f} s")


def _accel_like(n_components, algorithm):
    """A GPUTruncatedSVD built on the worker from scikit-learn's parameters, as accel builds it."""
    from sklearn.decomposition import TruncatedSVD

    from sklearn_gpu_bridge import GPUTruncatedSVD

    wrapper = GPUTruncatedSVD()
    wrapper._accel_params = TruncatedSVD(n_components, algorithm=algorithm, random_state=0).get_params()
    return wrapper


if __name__ == "__main__":
    main()
