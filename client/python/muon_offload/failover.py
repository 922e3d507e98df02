"""What a compute rank holds for failover inside a pool (docs/design.md, "Failover") for the
parameters it pushes straight to their owner, with no relay in its domain.

An owner with a buddy (plan ``servers[].buddy``) streams each applied step's state to the buddy
before it releases the update, so the buddy holds every step a rank has seen. When the rank
loses the owner, :class:`muon_offload.torch.OffloadMuon` registers the owner's parameters with
the buddy (which takes each over from its replica), pushes the step in flight again from the
gradients held here and commits it: the buddy computes it from the same contributions in the
same order (bitwise the owner's result), or answers with the update the owner computed when the
owner had replicated it already. When that server is lost in turn, the parameters go back to
the owner (restarted meanwhile, holding the buddy's replicas).

Held gradients: every gradient pushed for a covered parameter this step (one per micro-batch
under ``no_commit``, in push order: the server sums a rank's pushes in that order), as the
tensors pushed (fp32 or bf16, CPU or CUDA), until the step's update has arrived. This keeps a
reference, not a copy: the gradient's memory lives until the update arrives instead of being
freed after the push.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

__all__ = ["DirectFailover"]


class DirectFailover:
    """The failover pairs of one rank and the gradients it holds for the step in flight.

    ``pairs``: ``{parameter name: (owner index, buddy index)}`` into the trainer's server list
    (:func:`muon_offload.plan.failover_pairs`); parameters not named are not failed over."""

    #: Moves within one step: to the buddy, and back to the owner; a third loss in one step
    #: means both are gone.
    MAX_MOVES_PER_STEP = 2

    def __init__(self, pairs: Dict[str, Tuple[int, int]]):
        self.pairs = dict(pairs)
        self._held: Dict[str, List[object]] = {}
        self.moves = 0  # this step

    def covers(self, name: str) -> bool:
        """Whether ``name`` fails over (it has a pair)."""
        return name in self.pairs

    def other(self, name: str, lost: int) -> int:
        """The server of ``name``'s pair that is not ``lost``."""
        owner, buddy = self.pairs[name]
        return buddy if lost == owner else owner

    def hold(self, name: str, grad) -> None:
        """Keeps ``grad`` (as pushed) until ``release(name)``; nothing for an uncovered name."""
        if name in self.pairs:
            self._held.setdefault(name, []).append(grad)

    def held(self, name: str) -> List[object]:
        """The gradients pushed for ``name`` this step, in push order."""
        return self._held.get(name, [])

    def release(self, name: str) -> None:
        """The update of ``name``'s step arrived: its gradients are not needed any more."""
        self._held.pop(name, None)

    def end_step(self) -> None:
        """The step is over (done or failed): nothing held, the move count starts again."""
        self._held.clear()
        self.moves = 0
