"""A reference to the user's own code in a scenario: ``"package.module:function"``.

The model (``model: {factory: ...}``) and the data set (``dataset: {factory: ...}``) name a
callable this way, with keyword ``options``. The reference is checked for its shape here; it is
imported when the run is built (:func:`fedsim.config.factories.resolve_factory`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator

FACTORY_PATTERN = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$"
"""The shape of a factory reference: ``package.module:function`` (``:Class.method`` too)."""


def check_reference(value: str) -> str:
    """``value`` if it has the shape of :data:`FACTORY_PATTERN`, else a ValueError saying so."""
    if not re.match(FACTORY_PATTERN, value):
        raise ValueError(
            f"{value!r} is not of the form 'package.module:function' (a dotted module path, "
            "a colon, the name of a callable in it)"
        )
    return value


FactoryReference = Annotated[str, AfterValidator(check_reference)]
OptionValue = int | float | str | bool | None | list[Any] | dict[str, Any]
"""A keyword option given to a factory (anything YAML holds)."""
