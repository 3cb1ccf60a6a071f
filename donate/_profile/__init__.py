"""Memory profiles of compiled programs, from XLA's own buffer assignment (issue 22).

`memory_profile(jitted, *args, **kwargs)` reads XLA's buffer assignment and live ranges: from the
compiled program itself where it carries them (`proto` decodes it, `liverange` recomputes XLA's
live ranges), else from XLA's dump of a compile with `xla_dump_to` (`reading`). It names every
buffer in the user's terms (`naming`: source line, name stack, kind; `assemble`: pytree paths, the
timeline, donation advice) and returns a `MemoryProfile` (`profile`; its data in `model`, its
text, HTML and plot in `views`). A `donate.jit` stage reaches it through the
`__donate_program__` protocol (`source`).
"""

from donate._profile.api import memory_profile as memory_profile
from donate._profile.api import profile_of_compiled as profile_of_compiled
from donate._profile.api import profile_of_lowered as profile_of_lowered
from donate._profile.api import profile_of_source as profile_of_source
from donate._profile.api import signature_of as signature_of
from donate._profile.profile import MemoryProfile as MemoryProfile
from donate._profile.shadow import not_lowered_reason as not_lowered_reason
from donate._profile.shadow import strict_problems as peak_problems  # noqa: F401 (re-exported)
from donate._profile.source import Source as Source
from donate._profile.views import saving as saving
