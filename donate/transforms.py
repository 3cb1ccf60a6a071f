"""User-facing transforms: `jit`, and the in-function annotations `donate_buffer` and `alias`.

`jit` plans donation per leaf (see `donate._jit`); `donate_buffer` and `alias` record intent in the
jaxpr at any nesting depth (see `donate._primitives`), and the outermost `jit` honours it.
"""

from donate._jit import JitWrapped as JitWrapped
from donate._jit import jit as jit
from donate._primitives import alias as alias
from donate._primitives import donate_buffer as donate_buffer
from donate._stages import Compiled as Compiled
from donate._stages import Lowered as Lowered
from donate._stages import Traced as Traced

__all__ = ["Compiled", "JitWrapped", "Lowered", "Traced", "alias", "donate_buffer", "jit"]
