"""Train the random-forest regressor on embeddings and export it as a Treelite checkpoint."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from build_models.releases import check_treelite

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ForestMetrics:
    """Hold-out quality of the trained forest."""

    r2: float
    mae: float
    train_rows: int
    holdout_rows: int
    trainer: str


def _cuml_with_gpu() -> Any | None:
    try:
        import cupy
        from cuml.ensemble import RandomForestRegressor

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return RandomForestRegressor
    except Exception:
        return None
    return None


def train_forest(
    features: npt.NDArray[np.float32],
    targets: npt.NDArray[np.float32],
    trees: int,
    max_depth: int,
    seed: int,
) -> tuple[Any, ForestMetrics]:
    """Fit a RandomForestRegressor (cuML on a GPU, scikit-learn otherwise) and score a 20 % hold-out."""
    from sklearn.metrics import mean_absolute_error, r2_score
    from sklearn.model_selection import train_test_split

    x_train, x_test, y_train, y_test = train_test_split(
        features, targets, test_size=0.2, random_state=seed
    )
    cuml_forest = _cuml_with_gpu()
    if cuml_forest is not None:
        model = cuml_forest(n_estimators=trees, max_depth=max_depth, random_state=seed)
        trainer = "cuml"
    else:
        from sklearn.ensemble import RandomForestRegressor

        model = RandomForestRegressor(
            n_estimators=trees, max_depth=max_depth, random_state=seed, n_jobs=-1
        )
        trainer = "sklearn"
    model.fit(x_train.astype(np.float32), y_train.astype(np.float32))
    predicted = np.asarray(model.predict(x_test.astype(np.float32))).reshape(-1)
    metrics = ForestMetrics(
        r2=float(r2_score(y_test, predicted)),
        mae=float(mean_absolute_error(y_test, predicted)),
        train_rows=len(x_train),
        holdout_rows=len(x_test),
        trainer=trainer,
    )
    log.info("trained %s forest: hold-out R^2 %.3f, MAE %.3f", trainer, metrics.r2, metrics.mae)
    return model, metrics


def export_checkpoint(model: Any, trainer: str, triton_release: str, destination: Path) -> str:
    """Write ``model`` as a Treelite checkpoint readable by ``triton_release``'s FIL backend.

    Returns the Treelite version used; refuses (ReleaseMismatchError) when it does not match.
    """
    import treelite

    check_treelite(triton_release, treelite.__version__)
    # cuML forests convert themselves; scikit-learn ones go through Treelite's importer.
    tl_model = (
        model.convert_to_treelite_model()
        if trainer == "cuml"
        else treelite.sklearn.import_model(model)  # type: ignore[no-untyped-call]
    )
    destination.parent.mkdir(parents=True, exist_ok=True)
    tmp = destination.with_suffix(".tmp")
    tl_model.serialize(str(tmp))
    tmp.replace(destination)
    return str(treelite.__version__)


def predict_checkpoint(model: Any, features: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """Score ``features`` with a loaded Treelite model (GTIL): shape (n, 1) float32, as FIL returns."""
    import treelite

    raw = treelite.gtil.predict(model, np.ascontiguousarray(features, dtype=np.float32))
    return np.asarray(raw, dtype=np.float32).reshape(len(features), 1)
