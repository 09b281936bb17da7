"""The scenario's ``dataset:`` section: a named data set, generated data, the user's own arrays,
or the user's own factory.

``dataset: {factory: "package.module:function", options: {...}}`` names a callable that returns
the data (arrays or torch ``Dataset`` s; the accepted return types are
:mod:`fedsim.data.factory_data`'s contract). It is imported and called when the run is built.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from fedsim.config import limits
from fedsim.config.distributions import ClassCount, FeatureCount, SampleCount, Strict
from fedsim.config.factory import FactoryReference, OptionValue

DatasetName = Literal["mnist", "fashion_mnist", "cifar10", "femnist", "synthetic", "arrays"]


class Dataset(Strict):
    """Training / held-out data.

    A named data set (``mnist``) is looked for at ``path`` when given (relative to the scenario
    file's directory first, then to the working directory), then in ``$FEDSIM_DATA_DIR``, then
    in the user cache, and otherwise downloaded (sha256-verified) into the cache unless
    offline; see :mod:`fedsim.data.locate`. ``factory`` (instead of ``name``) is the
    user's own code returning the data: imported like ``model.factory`` (installed, on
    PYTHONPATH, in the working directory or beside the scenario file) and called with
    ``options`` (and ``seed`` when it takes one and ``options`` does not give it).
    """

    name: DatasetName | None = Field(
        default=None, description="The data set: mnist, fashion_mnist, cifar10, femnist (LEAF's "
        "per-writer layout), synthetic (a seeded Gaussian-mixture classification problem), or "
        "arrays (your own: an .npz at path holding x_train, y_train, x_test and y_test, or "
        "arrays from Python through fedsim.simulate). Omitted when factory is given.")
    factory: FactoryReference | None = Field(
        default=None, description="Your own data: 'package.module:function' returning the "
        "arrays (x_train, y_train, x_test, y_test) or a (train, test) pair of map-style torch "
        "Datasets; called with the options when the run is built.")
    options: dict[str, OptionValue] = Field(
        default_factory=dict, description="Keyword options of the data set factory.")
    path: Annotated[str, Field(max_length=4096, pattern=r"^[^\x00]*$")] | None = Field(
        default=None, description="Where the data set's file or directory is (for arrays, the "
        ".npz); a relative path is looked for beside the scenario file, then in the working "
        "directory. Omitted, $FEDSIM_DATA_DIR and the user cache are searched, and the data "
        "set is downloaded into the cache unless offline.")
    num_samples: SampleCount = Field(
        default=6000, description="Training records of the synthetic data set.")
    num_test_samples: SampleCount = Field(
        default=1000, description="Held-out records of the synthetic data set.")
    num_features: FeatureCount = Field(
        default=20, description="Features of each synthetic record.")
    num_classes: ClassCount = Field(
        default=4, description="Classes of the synthetic data set (at least 2).")
    test_subset: SampleCount | None = Field(
        default=None, description="Evaluate on at most this many held-out records, for speed; "
        "omitted, on all of them.")

    @model_validator(mode="after")
    def _name_or_factory(self) -> Dataset:
        if (self.name is None) == (self.factory is None):
            raise ValueError(
                "give either name (a built-in data set, synthetic or arrays) or factory "
                "('package.module:function' returning your data), "
                + ("not both" if self.name is not None else "one of them"))
        if self.factory is None and self.options:
            raise ValueError("options: only a data set factory takes options")
        if self.factory is not None and self.path is not None:
            raise ValueError("path: a data set factory finds its own data (give it an option)")
        if self.name == "synthetic" and self.path is not None:
            raise ValueError("path: a synthetic dataset is generated, it takes no path")
        values = self.num_samples * self.num_features
        if self.name == "synthetic" and values > limits.MAX_SYNTHETIC_VALUES:
            raise ValueError(
                f"num_samples x num_features is {values}, above the "
                f"{limits.MAX_SYNTHETIC_VALUES} values a generated training set may hold "
                "(it is drawn in memory at once)")
        return self
