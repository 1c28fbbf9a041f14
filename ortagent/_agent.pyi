from typing import final
from collections.abc import Sequence
from typing import Any, overload

from typing_extensions import disjoint_base

@final
class PartialGraphExecutionState:
    run_id: Any
    binding: Any
    def __init__(self) -> None: ...
    def release(self) -> None: ...
    @property
    def waiting_for_backward(self) -> bool: ...
    @property
    def status(self) -> str: ...
    @property
    def stash_size(self) -> int: ...
    @property
    def stash_devices(self) -> list[str]: ...

@final
class _AgentEngine:
    split: Any
    forward_session: Any
    backward_session: Any
    graph_output_index: dict[str, int]
    cpu_only: bool
    forward_output_devices: list[Any]
    graph_output_devices: list[Any]
    providers: list[str]
    closed: bool
    def __init__(self, split: Any, sess_options: Any = None, providers: Any = None,
                 provider_options: Any = None) -> None: ...
    def close(self) -> bool: ...
    def forward(self, state: PartialGraphExecutionState, graph_inputs: list[Any], run_options: Any,
                module_output_targets: list[Any] | None) -> list[Any]: ...
    def backward(self, state: PartialGraphExecutionState, gradients: list[Any], output_positions: list[int],
                 output_targets: list[Any], run_options: Any) -> list[Any]: ...
    def _plan_outputs(self, output_positions: list[int], output_targets: list[Any]) -> _OutputPlan: ...
    def _backward_planned(self, state: PartialGraphExecutionState, gradients: list[Any], plan: _OutputPlan,
                          run_options: Any) -> list[Any]: ...

@final
class _Preallocation:
    def __new__(cls, n_slots: int) -> _Preallocation: ...

@final
class _OutputPlan: ...

@disjoint_base
class _AgentHotPath:
    """Base of ortagent.TrainingAgent: run_forward / run_backward (state API in C)."""
    def _enable_hot_path(self, engine: _AgentEngine, forward: bool, backward: bool,
                         forward_targets: list[Any], output_positions: list[int],
                         output_targets: list[Any]) -> None: ...
    def _plan_of_state_api(self) -> _OutputPlan: ...
    @overload
    def run_forward(self, feeds_or_iobinding: Any, fetches_or_run_options: Any = None,
                    state: None = None, cache: Any = None) -> tuple[list[Any], int]: ...
    @overload
    def run_forward(self, feeds_or_iobinding: Sequence[Any], fetches_or_run_options: list[Any],
                    state: PartialGraphExecutionState, cache: Any = None) -> None: ...
    def run_backward(self, feeds_or_grads: Sequence[Any], fetches_or_run_id: Any,
                     state: PartialGraphExecutionState | None = None) -> None: ...
