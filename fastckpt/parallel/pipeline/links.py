"""The messages between neighbour pipeline stages: non-blocking sends from a pool of buffers, blocking receives.

Every message is the (rows, width) activation or delta of one micro-batch at a
stage boundary, sent as ``transport`` says (:mod:`fastckpt.parallel.pipeline.transport`).
Sends are non-blocking, from ``SEND_BUFFERS`` buffers per link that are
reused in turn (a send waits only for the one two sends before it to be
received); receives block.  Blocking sends would deadlock 1F1B, where two
neighbours send to each other at once; one buffer per link is already enough
(tests/test_pipeline.py plays every schedule up to 6 stages and 9 micro-batches
through these rules), and two let a stage compute while its last send drains.
"""
from .transport import Codec

SEND_BUFFERS = 2


class Link:
    """The messages of one direction to or from one neighbour stage, in ``transport``'s encoding."""

    def __init__(self, group, peer, transport, dtype, rows, width, pool=SEND_BUFFERS):
        self.comm, self.peer, self.MPI = group.comm, peer, group.MPI
        self.codec = Codec(transport, dtype, rows, width)
        self.native = transport == "native"
        self.pool = [self.codec.buffer() for _ in range(pool)]
        self.requests = [None] * pool
        self.inbox = None if self.native else self.codec.buffer()
        self.next = 0
        self.sent = 0

    def send(self, arr, tag):
        """Encode ``arr`` into the next pool buffer (waiting for that buffer's last send) and send it."""
        i, self.next = self.next, (self.next + 1) % len(self.pool)
        if self.requests[i] is not None:
            self.requests[i].Wait()
        msg = self.codec.encode(arr, self.pool[i], arr.shape[0])
        self.requests[i] = self.comm.Isend(msg, dest=self.peer, tag=tag)
        self.sent += msg.nbytes

    def stop(self, tag):
        """Send the empty message ``tag``: no delta, the step stopped (NOTE [ The optimizer in backward across
        stages ])."""
        self.requests.append(self.comm.Isend(self.pool[0][:0], dest=self.peer, tag=tag))

    def recv(self, out, tag):
        """Receive the message ``tag`` into ``out`` (rows, width), decoding it; False if it was empty."""
        status = self.MPI.Status()
        self.comm.Recv(out if self.native else self.inbox, source=self.peer, tag=tag, status=status)
        count = status.Get_count(self.MPI.BYTE)
        if count and not self.native:
            self.codec.decode(self.inbox[:count], out)
        return count > 0

    def wait(self):
        """Wait until every send has left its buffer."""
        self.MPI.Request.Waitall([r for r in self.requests if r is not None])
        self.requests = [None] * len(self.pool)
