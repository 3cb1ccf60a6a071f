"""donate: explicit buffer donation, aliasing, preallocated outputs and symmetric memory for JAX."""

# First: under `python -m donate...` on a machine without an NVIDIA GPU, JAX starts without the
# CUDA plugin's start-up lines (donate/_base/startup.py).
from donate._base import startup as _startup  # noqa: F401

# isort: split
from donate import planner as planner
from donate import targets as targets
from donate._base.errors import DonationError as DonationError
from donate._base.errors import SymmetricMemoryWarning as SymmetricMemoryWarning
from donate._base.errors import UnusableDonationWarning as UnusableDonationWarning
from donate._plan.decision_types import Action as Action
from donate._plan.decision_types import Cause as Cause
from donate._plan.decision_types import Kind as Kind
from donate._plan.decision_types import Request as Request
from donate._plan.donation_plan import DonationPlan as DonationPlan
from donate._plan.donation_plan import Layout as Layout
from donate._plan.donation_plan import LeafDecision as LeafDecision
from donate._plan.donation_plan import LeafInfo as LeafInfo
from donate._plan.donation_plan import OutputInfo as OutputInfo
from donate._plan.memory_stats import MemoryStats as MemoryStats
from donate._profile import MemoryProfile as MemoryProfile
from donate._profile import memory_profile as memory_profile
from donate._profile.advice import Advice as Advice
from donate._profile.model import Change as Change
from donate._profile.model import Comparison as Comparison
from donate._profile.model import Entry as Entry
from donate._profile.model import Fit as Fit
from donate._profile.model import Group as Group
from donate._profile.model import Line as Line
from donate._profile.model import Step as Step
from donate._profile.model import Suggestion as Suggestion
from donate._profile.model import Timeline as Timeline
from donate._profile.profile import Saving as Saving
from donate._profile.shadow import Shadow as Shadow
from donate._profile.variants import Program as Program
from donate._xla.copy_record import CopyRecord as CopyRecord
from donate._xla.copy_record import Loop as Loop
from donate.symm import requires_symmetric as requires_symmetric
from donate.symm import symmetric_memory as symmetric_memory
from donate.symm import with_symmetric as with_symmetric
from donate.transforms import alias as alias
from donate.transforms import donate_buffer as donate_buffer
from donate.transforms import jit as jit

__version__ = "0.1.0"

__all__ = [
  "Action",
  "Advice",
  "Cause",
  "Change",
  "Comparison",
  "CopyRecord",
  "DonationError",
  "DonationPlan",
  "Entry",
  "Fit",
  "Group",
  "Kind",
  "Layout",
  "LeafDecision",
  "LeafInfo",
  "Line",
  "Loop",
  "MemoryProfile",
  "MemoryStats",
  "OutputInfo",
  "Program",
  "Request",
  "Saving",
  "Shadow",
  "Step",
  "Suggestion",
  "SymmetricMemoryWarning",
  "Timeline",
  "UnusableDonationWarning",
  "alias",
  "donate_buffer",
  "jit",
  "memory_profile",
  "planner",
  "requires_symmetric",
  "symmetric_memory",
  "targets",
  "with_symmetric",
]
