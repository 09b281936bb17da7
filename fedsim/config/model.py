"""The scenario's ``model`` section: a built-in model by name, or the user's own factory, with
options, an optional loss factory and BatchNorm's replacement.

The built-in names are checked here, with the schema (:data:`BUILTIN_MODELS`, which
:data:`fedsim.training.models.MODELS` builds): a misspelt model is an error with its YAML line
even where the data is not. The options of a built-in model are checked against its
constructor where the model is built, or without data by ``fedsim validate``
(:func:`fedsim.training.models.check_model_options`).
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, field_validator, model_validator

from fedsim.config.distributions import Strict
from fedsim.config.factory import FactoryReference, OptionValue

__all__ = ["BUILTIN_MODELS", "Model", "ModelName"]


ModelName = Literal["logreg", "mlp", "dp_mnist_cnn", "groupnorm_cnn"]
BUILTIN_MODELS: tuple[str, ...] = get_args(ModelName)
"""The names ``model.name`` may give (:data:`fedsim.training.models.MODELS` builds them): checked
with the schema, so a misspelt model is an error with its line even where the data is not."""


class Model(Strict):
    """The model: a built-in one by ``name``, or the user's own ``factory``, with options.

    ``factory: "package.module:function"`` is imported when the run is built (the module must
    be installed or on PYTHONPATH; the current directory and the scenario file's directory are
    also searched) and called with ``options`` as keyword arguments, plus ``num_classes`` and
    ``input_shape`` (one example's shape) from the data when it takes them and ``options``
    does not give them. It must return a ``torch.nn.Module`` that DP-SGD can train (checked).
    Neither given: the model comes from Python (``model_factory``).
    """

    name: ModelName | None = Field(
        default=None, description="A built-in model by name (logreg, mlp, dp_mnist_cnn or "
        "groupnorm_cnn).")
    factory: FactoryReference | None = Field(
        default=None, description="Your own model: 'package.module:function', imported when "
        "the run is built and called with the options.")
    options: dict[str, OptionValue] = Field(
        default_factory=dict, description="Keyword options of the model, such as hidden: "
        "[128] for an MLP; input size and class count come from the data when omitted.")
    loss: FactoryReference | None = Field(
        default=None, description="Your own training loss: 'package.module:function', a "
        "factory called with loss_options that returns loss(outputs, targets) -> one loss per "
        "example (reduction='none'; checked on a probe batch). Default: cross-entropy.")
    loss_options: dict[str, OptionValue] = Field(
        default_factory=dict, description="Keyword options of the loss factory.")
    fix_batchnorm: bool = Field(
        default=False, description="Replace every BatchNorm layer by GroupNorm instead of refusing the "
        "model: BatchNorm mixes the examples of a batch, which per-example DP-SGD cannot "
        "train. BatchNorm1d becomes GroupNorm(1, C) (each example normalised over its C "
        "features, as LayerNorm does; over C x L values on (N, C, L) input); BatchNorm2d/3d "
        "GroupNorm(gcd(32, C), C) as Opacus's ModuleValidator.fix does.")

    @field_validator("name", mode="before")
    @classmethod
    def _built_in(cls, name: object) -> object:
        if isinstance(name, str) and name not in BUILTIN_MODELS:  # (else: the type's error)
            raise ValueError(f"unknown model {name!r}; the built-in models are "
                             f"{', '.join(BUILTIN_MODELS)} (your own: model.factory)")
        return name

    @model_validator(mode="after")
    def _name_or_factory(self) -> Model:
        if self.name is not None and self.factory is not None:
            raise ValueError(
                "give either name (a built-in model) or factory ('package.module:function'), "
                "not both"
            )
        return self
