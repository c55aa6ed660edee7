"""cuml.naive_bayes: naive Bayes classifiers, declared (see spec.py)."""

import numpy as np

from .spec import remote_estimator


class _LabelsAsUniqueLabels:
    """scikit-learn's naive Bayes classes take ``classes_`` from ``unique_labels``: strings held
    in an object array (a pandas Series) come back as a str array, and so do their predictions."""

    def _validate_fit(self, X, y, reset=True):
        X, codes = super()._validate_fit(X, y, reset)
        if reset and self.classes_.dtype == object:
            self.classes_ = np.asarray(self.classes_.tolist())  # already sorted and unique: the codes hold
        return X, codes


_DISCRETE = "*, alpha=1.0, fit_prior=True, class_prior=None"
# scikit-learn's own tags for the discrete classes
_POSITIVE = {"input_tags.positive_only": True, "classifier_tags.poor_score": True}

GPUGaussianNB = remote_estimator(
    "GaussianNB", "classifier", "*, priors=None, var_smoothing=1e-9",
    bases=(_LabelsAsUniqueLabels,), doc="Gaussian naive Bayes.",
)

GPUMultinomialNB = remote_estimator(
    "MultinomialNB", "classifier", _DISCRETE, tags=_POSITIVE,
    bases=(_LabelsAsUniqueLabels,), doc="naive Bayes for multinomial counts. cuML's fit takes no sample_weight.",
)

GPUBernoulliNB = remote_estimator(
    "BernoulliNB", "classifier", "*, alpha=1.0, binarize=0.0, fit_prior=True, class_prior=None",
    tags={"classifier_tags.poor_score": True}, bases=(_LabelsAsUniqueLabels,),
    doc="naive Bayes for binary features. cuML's fit takes no sample_weight.",
)

GPUComplementNB = remote_estimator(
    "ComplementNB", "classifier", _DISCRETE + ", norm=False", tags=_POSITIVE, bases=(_LabelsAsUniqueLabels,),
    doc="complement naive Bayes (for imbalanced counts). cuML's fit takes no sample_weight.",
)

GPUCategoricalNB = remote_estimator(
    "CategoricalNB", "classifier", _DISCRETE,
    tags={**_POSITIVE, "input_tags.categorical": True}, bases=(_LabelsAsUniqueLabels,),
    doc="naive Bayes for categorical features (non-negative integer codes). cuML's fit takes "
        "no sample_weight.",
)

__all__ = [name for name in dir() if name.startswith("GPU")]
