"""The turns of :class:`~fastckpt.parallel.crew.Crew`'s ordered sum (NOTE [ Deterministic reduction ] in
:mod:`fastckpt.parallel.threads`)."""
from fastckpt.kernels import add_in_turn


class Stopped(Exception):
    """Another worker failed, so this one's turn never comes."""


class Turns:
    """Adds minibatch ``k``'s gradient to the sum after ``k - 1``'s (NOTE [ Deterministic reduction ])."""

    def __init__(self, shared):
        self.shared = shared

    def add(self, total, k, grad, blocks, me=0):
        """Worker ``me`` adds minibatch ``k``'s ``grad`` to ``total`` in its turn."""
        shared = self.shared
        while True:
            seen = add_in_turn(shared.flags, k, total, grad, blocks, shared.spins, shared.gate, me)
            if seen == k + 1:
                shared.wake()
                return
            if seen < 0 or shared.wait(0, k, 0, me) < 0 or shared.flags[0] > k:
                raise Stopped(f"minibatch {k}: another worker failed first")

    def fail(self):
        self.shared.flags[0] = -1
        self.shared.wake()
