"""``--config`` values of an ``hf:`` workload, held to the config class's own types and validators.

transformers' configs are strict dataclasses (``huggingface_hub.dataclasses.strict``): each field is
annotated (``hidden_size: int``, ``num_key_value_heads: int | None``) and class validators check the
combination (``hidden_size`` a multiple of ``num_attention_heads``). The command line's words are
converted to the annotated type here, before any config is built, and whatever the config (or, later,
the model built from it) refuses becomes one ``UsageError`` line that names the values and the reason:
a typo is a usage error (exit 2), never a traceback.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from memclaims.core.errors import MemclaimsError, UsageError

_T = TypeVar("_T")
_SCALARS = (bool, int, float, str, type(None))
_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a word", type(None): "none"}


def parse_value(text: str) -> object:
    """``--config`` values: integers, floats, true/false/none, else the string itself."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def format_value(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def field_types(config_class: type) -> dict[str, object]:
    """Each field's annotation (a type object; a string annotation is left to the validators)."""
    if not dataclasses.is_dataclass(config_class):
        return {}  # a config without annotated fields: its own __init__ and validators decide
    return {f.name: f.type for f in dataclasses.fields(config_class) if not isinstance(f.type, str)}


def _allowed(annotation: object) -> tuple[Any, ...]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _is(value: object, kind: Any) -> bool:  # kind: a member of a field's annotation, any typing form
    """``isinstance`` where true and false are not integers (``bool`` subclasses ``int``)."""
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def convert(key: str, value: Any, annotation: Any, owner: str) -> Any:
    """``value`` (as ``hf.parse_value`` read it) as the field's type: an integer for a float field
    becomes a float, a whole float for an integer field an integer, any word for a string field
    that word; a value no scalar member of the annotation takes is refused. Annotations with other
    members (lists, dicts, Literal, classes) keep the value for the config's validators to judge."""
    allowed = _allowed(annotation)
    if any(kind in _SCALARS and _is(value, kind) for kind in allowed):
        return value
    if float in allowed and _is(value, int):
        return float(value)
    if int in allowed and _is(value, float) and float(value).is_integer():
        return int(value)
    if str in allowed:
        return format_value(value)
    if not all(kind in _SCALARS for kind in allowed):
        return value
    expected = " or ".join(_NAMES[kind] for kind in allowed)
    raise UsageError(f"--config {key}={format_value(value)}: {owner}.{key} takes {expected}, "
                     f"got {format_value(value)!r}")


def converted(overrides: Mapping[str, object], config_class: type, attribute_map: Mapping[str, str]) -> dict[str, object]:
    """Every override as its field's type (a key spelled through ``attribute_map``, as GPT-2's
    ``num_hidden_layers`` for ``n_layer``, takes the mapped field's type)."""
    annotations = field_types(config_class)
    result: dict[str, object] = {}
    for key, value in overrides.items():
        annotation = annotations.get(attribute_map.get(key, key))
        result[key] = value if annotation is None else convert(key, value, annotation, config_class.__name__)
    return result


def _reason(error: BaseException) -> str:
    """One line: the validator's own cause (``StrictDataclass*Error`` wraps it), whitespace folded."""
    from huggingface_hub.errors import StrictDataclassError

    wrapped = isinstance(error, StrictDataclassError) and error.__cause__ is not None
    cause = error.__cause__ if wrapped and error.__cause__ is not None else error
    return " ".join(f"{type(cause).__name__}: {cause}".split())


def refused(what: str, overrides: Mapping[str, object], build: Callable[[], _T]) -> _T:
    """``build()`` (a config, or a model from one), with a refusal of the user's ``overrides`` as one
    UsageError line. Without overrides a failure is not the user's: it propagates as it is; so do
    memclaims' own errors and running out of memory."""
    import torch

    try:
        return build()
    except (MemclaimsError, torch.OutOfMemoryError, MemoryError, KeyboardInterrupt):
        raise
    except Exception as error:
        if not overrides:
            raise
        raise refusal(what, overrides, error) from error


def refusal(what: str, overrides: Mapping[str, object], error: BaseException) -> UsageError:
    """The one line for ``what`` (a config, a model, its forward) refusing the user's values."""
    given = ",".join(f"{k}={format_value(v)}" for k, v in sorted(overrides.items()))
    return UsageError(f"--config {given}: {what} refuses it: {_reason(error)}")
