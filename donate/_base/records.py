"""Frozen records built at the speed of plain ones.

A plan makes a few frozen dataclass records per leaf (`LeafInfo`, `OutputInfo`, `LeafDecision`):
a wide pytree's thousands. The `__init__` dataclasses generates for a frozen class sets each field
through `object.__setattr__`, about twice the time of setting it through its slot's own
descriptor; `fast_init` gives a frozen, slotted dataclass an `__init__` of the second kind. The
record stays frozen (assigning a field raises `FrozenInstanceError`), and `dataclasses.replace`,
equality, hashing and the signature are unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

T = TypeVar("T")


def fast_init(cls: type[T]) -> type[T]:
  """`cls` (a frozen dataclass with `slots=True`, no `__post_init__`, no default factories,
  no keyword-only fields) with an `__init__` that fills its slots directly.

  >>> @fast_init
  ... @dataclasses.dataclass(frozen=True, slots=True)
  ... class Point:
  ...   x: int
  ...   y: int = 0
  >>> Point(1), Point(1, 2) == Point(x=1, y=2), dataclasses.replace(Point(1), y=3)
  (Point(x=1, y=0), True, Point(x=1, y=3))
  >>> Point(1).x = 2
  Traceback (most recent call last):
  dataclasses.FrozenInstanceError: cannot assign to field 'x'
  """
  params = getattr(cls, "__dataclass_params__", None)
  frozen = params is not None and params.frozen and "__slots__" in cls.__dict__
  if not frozen or hasattr(cls, "__post_init__"):
    raise TypeError(f"fast_init takes a frozen, slotted dataclass, not {cls.__name__}")
  scope: dict = {}
  args, body = [], []
  for k, field in enumerate(dataclasses.fields(cls)):  # type: ignore[arg-type]  # a dataclass
    if field.kw_only or field.default_factory is not dataclasses.MISSING or not field.init:
      raise TypeError(f"fast_init: {cls.__name__}.{field.name} is not a plain field")
    scope[f"_set{k}"] = getattr(cls, field.name).__set__  # the slot's own descriptor
    if field.default is dataclasses.MISSING:
      args.append(field.name)
    else:
      scope[f"_default{k}"] = field.default
      args.append(f"{field.name}=_default{k}")
    body.append(f"  _set{k}(self, {field.name})\n")
  source = f"def __init__(self, {', '.join(args)}):\n{''.join(body)}"
  exec(source, scope)  # as dataclasses itself builds __init__
  init = scope["__init__"]
  init.__qualname__ = f"{cls.__qualname__}.__init__"
  init.__module__ = cls.__module__
  cls.__init__ = init  # type: ignore[method-assign]  # replaces the generated one
  return cls
