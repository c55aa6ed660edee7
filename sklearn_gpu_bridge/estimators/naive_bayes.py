"""cuml.naive_bayes: naive Bayes classifiers, declared (see spec.py)."""

from .spec import remote_estimator

_DISCRETE = "*, alpha=1.0, fit_prior=True, class_prior=None"
# scikit-learn's own tags for the discrete classes
_POSITIVE = {"input_tags.positive_only": True, "classifier_tags.poor_score": True}

GPUGaussianNB = remote_estimator(
    "GaussianNB", "classifier", "*, priors=None, var_smoothing=1e-9",
    doc="Gaussian naive Bayes.",
)

GPUMultinomialNB = remote_estimator(
    "MultinomialNB", "classifier", _DISCRETE, tags=_POSITIVE,
    doc="naive Bayes for multinomial counts. cuML's fit takes no sample_weight.",
)

GPUBernoulliNB = remote_estimator(
    "BernoulliNB", "classifier", "*, alpha=1.0, binarize=0.0, fit_prior=True, class_prior=None",
    tags={"classifier_tags.poor_score": True},
    doc="naive Bayes for binary features. cuML's fit takes no sample_weight.",
)

GPUComplementNB = remote_estimator(
    "ComplementNB", "classifier", _DISCRETE + ", norm=False", tags=_POSITIVE,
    doc="complement naive Bayes (for imbalanced counts). cuML's fit takes no sample_weight.",
)

GPUCategoricalNB = remote_estimator(
    "CategoricalNB", "classifier", _DISCRETE,
    tags={**_POSITIVE, "input_tags.categorical": True},
    doc="naive Bayes for categorical features (non-negative integer codes). cuML's fit takes "
        "no sample_weight.",
)

__all__ = [name for name in dir() if name.startswith("GPU")]
