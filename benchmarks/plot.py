"""Plot an e2e result JSON: the three ways per case, log-scaled seconds, as a PNG beside it.

    python benchmarks/plot.py benchmarks/results/e2e-h100.json
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

WAYS = (("sklearn", "scikit-learn (CPU, in process)"), ("cuml", "cuML (GPU, in process)"),
        ("bridge", "sklearn-gpu-bridge -> {backend} worker"))


def plot(path):
    path = Path(path)
    report = json.loads(path.read_text())
    rows = list(report.get("cases", []))
    grid = report.get("grid_search")
    if grid:
        rows.append({"case": f"GridSearchCV Pipeline(scaler, SVC) 12x3 on {grid['shape'][0]}x{grid['shape'][1]}",
                     "sklearn": grid.get("sklearn (n_jobs=-1)"), "cuml": grid.get("cuml"), "bridge": grid.get("bridge")})
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(rows) + 1.5))
    height = 0.27
    y = np.arange(len(rows))
    for i, (key, label) in enumerate(WAYS):
        values = [row[key]["median"] if row.get(key) else np.nan for row in rows]
        ax.barh(y + (i - 1) * height, values, height, label=label.format(backend=report["backend"]))
    ax.set_yticks(y, [row["case"] for row in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("median seconds (log scale; shorter is faster)")
    gpu = report.get("machine", {}).get("gpu", "no GPU")
    ax.set_title(f"{gpu}, {report['machine'].get('cpus')} CPU cores, backend {report['backend']}", fontsize=10)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    for argument in sys.argv[1:]:
        plot(argument)
