"""User-facing transforms: `jit`, and the in-function annotations `donate_buffer` and `alias`.

`jit` plans donation per leaf (see `donate._jit.wrapper`); `donate_buffer` and `alias` record
intent in the jaxpr at any nesting depth (see `donate._base.primitives`), and the outermost
`jit` honours it.
"""

from donate._base.primitives import alias as alias
from donate._base.primitives import donate_buffer as donate_buffer
from donate._jit.into import Into as Into
from donate._jit.stages import Compiled as Compiled
from donate._jit.stages import Lowered as Lowered
from donate._jit.stages import Traced as Traced
from donate._jit.wrapper import JitWrapped as JitWrapped
from donate._jit.wrapper import jit as jit

__all__ = [
  "Compiled",
  "Into",
  "JitWrapped",
  "Lowered",
  "Traced",
  "alias",
  "donate_buffer",
  "jit",
]
