"""The data-parallel gradient sum in buckets, each started while the backward pass goes on.

NOTE [ Overlapped buckets ]
A layer's gradient is final as soon as its backward op has run, and the
backward pass runs the layers from the top down.  So the layers are grouped
from the top into buckets of at least ``bucket_bytes`` (PyTorch DDP's
``bucket_cap_mb``); each bucket's layers are contiguous in the parameter
layout (a suffix of what is left).  The engine cuts its kernel calls after the
backward op of each bucket's lowest layer (:meth:`Engine.gradients` ``cuts``),
and after each cut this rank's part of the bucket is written to the send buffer
(its weight and bias blocks copied, or added to the earlier minibatches' sum by
the kernel that adds them in a whole step) and a non-blocking ``Iallreduce`` of it starts; the next
calls test the requests so that MPI moves them on, and the update waits for
all.  Every rank gets the same sum bit for bit (an MPI allreduce's result is
the same on every rank); with 2 ranks it is the ordered reduce's too, since
``a + b == b + a``.  With more ranks the sum's order is MPI's, not rank
order: equal up to rounding.
"""
from fastckpt.core.layout import param_blocks, param_layout
from fastckpt.kernels import accumulate


def bucket_layers(sizes, itemsize, bucket_bytes):
    """Layers per bucket, from the top: ``[(lo, hi), ...]`` with ``hi`` exclusive, each bucket the fewest
    top-most remaining layers holding at least ``bucket_bytes`` of parameters (the last may hold less)."""
    offsets, total = param_layout(sizes, itemsize)
    starts = [w_at for w_at, _ in offsets] + [total]
    buckets, hi = [], len(sizes) - 1
    while hi > 0:
        lo = hi - 1
        while lo > 0 and (starts[hi] - starts[lo]) * itemsize < bucket_bytes:
            lo -= 1
        buckets.append((lo, hi))
        hi = lo
    return buckets


class Buckets:
    """One rank's overlapped gradient sum over ``comm`` for nets of ``sizes`` (NOTE [ Overlapped buckets ]).

    ``send`` and ``total`` are flat buffers in the parameter layout: this rank's part and, after
    :meth:`wait`, the sum over the ranks.  Every rank posts the same buckets in the same order.
    """

    def __init__(self, comm, MPI, sizes, itemsize, bucket_bytes, send, total):
        self.comm, self.MPI, self.send, self.total = comm, MPI, send, total
        offsets, end = param_layout(sizes, itemsize)
        starts = [w_at for w_at, _ in offsets] + [end]
        blocks = param_blocks(sizes, itemsize)
        self.buckets = [(lo, starts[lo], starts[hi],
                         blocks[(blocks[:, 0] >= starts[lo]) & (blocks[:, 1] <= starts[hi])])
                        for lo, hi in bucket_layers(sizes, itemsize, bucket_bytes)]
        self.requests = []

    def cuts(self, workspace):
        """Where the engine ends a kernel call: after the backward op of each bucket's lowest layer (rows of the
        ``workspace``'s table)."""
        plan = workspace.plan
        backward = {layer: workspace.op_rows[i] for i, (kind, layer) in enumerate(plan.ops) if kind == "bwd"}
        return [backward[lo] + 1 for lo, _, _, _ in self.buckets]

    def start(self, workspace, grad, add):
        """The ``after`` callback of a step in ``workspace`` whose gradients are ``grad``: this rank's part is
        ``grad`` (``add``: plus what ``send`` holds), a bucket's worth at a time."""
        self.requests, pending = [], list(zip(self.cuts(workspace), self.buckets))

        def after(hi):
            while pending and pending[0][0] <= hi:
                _, (_, a, b, blocks) = pending.pop(0)
                if add:
                    accumulate(self.send, grad, blocks)
                else:
                    for lo, end in blocks:
                        self.send[lo:end] = grad[lo:end]
                self._post(a, b)
            if self.requests:
                self.MPI.Request.Testall(self.requests)        # MPI moves the sums on only inside its calls
        return after

    def start_zeros(self):
        """Every bucket of an all-zero part (a rank with no minibatch this update)."""
        self.send[...] = 0.0
        self.requests = []
        for _, a, b, _ in self.buckets:
            self._post(a, b)

    def _post(self, a, b):
        self.requests.append(self.comm.Iallreduce(self.send[a:b], self.total[a:b], op=self.MPI.SUM))

    def wait(self):
        """Wait for every bucket's sum; ``total`` then holds it."""
        self.MPI.Request.Waitall(self.requests)
        self.requests = []
