"""One engine step's metadata, as one record.

The nine metadata keywords of ``jitconv.causal_conv1d_mixed`` / ``jitconv.plan`` (names as
vLLM's GDN metadata) travel together: the public calls build a ``StepMetadata`` once and
hand it down (plans, device plans, the one-shot ops' plan cache, the torch custom ops,
the vLLM drop-ins), so that no layer spells the nine names again. The values are what
the caller gave (tensors, numpy arrays, lists, USM arrays, or None); the checks that
turn them into a plan's sequences are ``jitconv.api.ops``' (host) and
``jitconv.api.device_plan``'s (device).
"""

from dataclasses import dataclass, fields
from typing import Any

from jitconv.kernels import planner

# The names, in the order the ops and their custom ops take them.
NAMES = ("non_spec_query_start_loc", "non_spec_state_indices", "has_initial_state",
         "non_spec_token_indx", "spec_query_start_loc", "spec_state_indices",
         "spec_token_indx", "num_accepted_tokens", "non_spec_num_accepted_tokens")
# The state rules beyond linear spec verify (SEMANTICS.md "More state rules") that a
# step's metadata may carry (device plans take some: ``DEVICE_RULES``; the custom ops'
# schemas take the nine above).
RULE_NAMES = ("spec_parent_token", "non_spec_parent_token", "spec_window_rows",
              "non_spec_window_rows", "spec_write_indices", "non_spec_write_indices",
              "non_spec_checkpoint_loc", "non_spec_checkpoint_pos",
              "non_spec_checkpoint_indices", "non_spec_cache_seqlens")
ALL_NAMES = NAMES + RULE_NAMES
# The device planner's array of each (``kernels.planner.METADATA_ARRAYS``).
DEVICE_ARRAYS = dict(ns_qsl="non_spec_query_start_loc", ns_lines="non_spec_state_indices",
                     ns_init="has_initial_state", ns_accepted="non_spec_num_accepted_tokens",
                     sp_qsl="spec_query_start_loc", sp_lines="spec_state_indices",
                     sp_accepted="num_accepted_tokens", ns_map="non_spec_token_indx",
                     sp_map="spec_token_indx")
assert set(DEVICE_ARRAYS) == set(planner.METADATA_ARRAYS)
# The state rules device plans take (``kernels.planner.RULE_ARRAYS``); checkpoints and
# circular lines are planned on the host only.
DEVICE_RULES = dict(ns_parents="non_spec_parent_token", sp_parents="spec_parent_token",
                    ns_windows="non_spec_window_rows", sp_windows="spec_window_rows",
                    ns_write="non_spec_write_indices", sp_write="spec_write_indices")
assert set(DEVICE_RULES) == set(planner.RULE_ARRAYS)


@dataclass(frozen=True, kw_only=True)
class StepMetadata:
    """The metadata of one engine step (see ``jitconv.causal_conv1d_mixed`` for each)."""
    non_spec_query_start_loc: Any = None
    non_spec_state_indices: Any = None
    has_initial_state: Any = None
    non_spec_token_indx: Any = None
    spec_query_start_loc: Any = None
    spec_state_indices: Any = None
    spec_token_indx: Any = None
    num_accepted_tokens: Any = None
    non_spec_num_accepted_tokens: Any = None
    spec_parent_token: Any = None
    non_spec_parent_token: Any = None
    spec_window_rows: Any = None
    non_spec_window_rows: Any = None
    spec_write_indices: Any = None
    non_spec_write_indices: Any = None
    non_spec_checkpoint_loc: Any = None
    non_spec_checkpoint_pos: Any = None
    non_spec_checkpoint_indices: Any = None
    non_spec_cache_seqlens: Any = None

    @classmethod
    def of(cls, values):
        """The record of a mapping of names to values (a name it does not know is an
        error naming it)."""
        unknown = set(values) - set(ALL_NAMES)
        if unknown:
            raise TypeError(f"{sorted(unknown)[0]}: not a metadata argument; expected "
                            f"{', '.join(ALL_NAMES)}")
        return cls(**values)

    def values(self):
        """The nine values, in ``NAMES`` order."""
        return tuple(getattr(self, name) for name in NAMES)

    def all_values(self):
        """Every value, in ``ALL_NAMES`` order (what a plan depends on)."""
        return tuple(getattr(self, name) for name in ALL_NAMES)

    def has_rules(self):
        """Whether a value of ``RULE_NAMES`` is given (then the step is planned on the
        host)."""
        return any(getattr(self, name) is not None for name in RULE_NAMES)

    def device_arrays(self):
        """The values by device planner array name (``planner.METADATA_ARRAYS``)."""
        return {key: getattr(self, name) for key, name in DEVICE_ARRAYS.items()}

    def device_rules(self):
        """The state rules by rule planner array name (``planner.RULE_ARRAYS``)."""
        return {key: getattr(self, name) for key, name in DEVICE_RULES.items()}

    def host_only_rules(self):
        """The names of the rules given that only host plans take (checkpoints, rings)."""
        device = set(DEVICE_RULES.values())
        return [n for n in RULE_NAMES if n not in device and getattr(self, n) is not None]


assert tuple(f.name for f in fields(StepMetadata)) == ALL_NAMES
