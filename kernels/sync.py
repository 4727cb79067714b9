"""Flags that threads wait on without the GIL: a bounded spin before a thread goes to sleep.

A thread that sleeps on a lock takes 10-25 us to wake on a virtual machine (a
Python ``Event`` round trip between two threads: 17-24 us on a 2-core AMD
EPYC), and then it still needs the GIL.  ``DataParallel``'s workers meet eight
times or more per update of a few hundred microseconds, so they first wait
here: reading an int64 flag in a loop with ``pause``, the GIL released, for a
bounded number of turns, and only then on a condition variable
(:mod:`fastckpt.parallel.crew`).

The flags are int64 arrays; reads are acquire loads and writes release stores,
so what a thread wrote before it raised a flag is seen by the thread that sees
the flag.  A negative flag means "stop": every wait returns at once.

NOTE [ Turns at the GIL ]
A kernel releases the GIL when it starts and takes it back when it ends.  When
another thread holds the GIL then, the returning thread sleeps on CPython's
condition variable until it is dropped, and pays the 10-25 us wake-up above:
on minibatches of 10, DataParallel's two threads each ran their gradients 30%
slower than one thread alone, most of it in such waits.  So the threads of a
crew also share a *gate*, an int64 array ``[holder, spins]``: a thread that
runs Python in the crew's loop holds it.  A gated kernel leaves the gate when
it starts (after the GIL is released) and, when it ends, spins up to ``spins``
turns until the gate is free and takes it, before it asks for the GIL: the
GIL is then free, as whoever runs Python holds the gate.  The gate is only
advice: a kernel that does not get it within its turns goes on without it, so
a holder that blocks (on a lock, or in a sleep) costs the others a bounded
spin, never a hang, and it changes no number.  ``spins = 0`` (the crew does not
spin, or a caller outside a crew: :func:`new_gate`) makes it a no-op.

NOTE [ No JIT ] (:mod:`kernels.bits`): without the JIT these are Python
functions that look once and never spin, as a spinning Python loop would hold
the GIL that the thread it waits for needs.
"""
import numpy as np
from numba import config, types

from ._jit import inline, kernel
from .elementwise import accumulate

_SPIN = not config.DISABLE_JIT              # a constant to the compiler

if config.DISABLE_JIT:
    def load_acquire(flags, i):
        return flags[i]

    def store_release(flags, i, value):
        flags[i] = value

    def pause():
        pass

    def compare_exchange(flags, i, expected, new):
        seen = flags[i]
        if seen == expected:
            flags[i] = new
        return seen
else:
    from llvmlite import ir
    from numba.core import cgutils
    from numba.extending import intrinsic

    def _address(context, builder, array_type, array, index):
        data = context.make_array(array_type)(context, builder, array).data
        return builder.gep(data, [index])

    @intrinsic
    def load_acquire(typingctx, flags, i):
        """``flags[i]`` (int64, C-contiguous, 1-D), read with acquire ordering."""
        if not (isinstance(flags, types.Array) and flags.dtype == types.int64):
            return None

        def codegen(context, builder, signature, args):
            return builder.load_atomic(_address(context, builder, signature.args[0], args[0], args[1]),
                                       "acquire", 8)
        return types.int64(flags, types.intp), codegen

    @intrinsic
    def store_release(typingctx, flags, i, value):
        """``flags[i] = value`` with release ordering."""
        if not (isinstance(flags, types.Array) and flags.dtype == types.int64):
            return None

        def codegen(context, builder, signature, args):
            value = context.cast(builder, args[2], signature.args[2], types.int64)
            builder.store_atomic(value, _address(context, builder, signature.args[0], args[0], args[1]),
                                 "release", 8)
            return context.get_dummy_value()
        return types.void(flags, types.intp, value), codegen

    @intrinsic
    def compare_exchange(typingctx, flags, i, expected, new):
        """``flags[i] = new`` if it holds ``expected``, atomically; returns the value it held."""
        if not (isinstance(flags, types.Array) and flags.dtype == types.int64):
            return None

        def codegen(context, builder, signature, args):
            old, new_ = (context.cast(builder, args[k], signature.args[k], types.int64) for k in (2, 3))
            pair = builder.cmpxchg(_address(context, builder, signature.args[0], args[0], args[1]), old, new_,
                                   "acq_rel", "acquire")
            return builder.extract_value(pair, 0)
        return types.int64(flags, types.intp, expected, new), codegen

    @intrinsic
    def pause(typingctx):
        """x86's ``pause``: a spinning core yields to its sibling and leaves the loop without a stall."""
        def codegen(context, builder, signature, args):
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse2.pause")
            builder.call(fn, [])
            return context.get_dummy_value()
        return types.void(), codegen


def new_gate():
    """A gate that no thread holds and that never spins (NOTE [ Turns at the GIL ])."""
    return np.array([-1, 0], dtype=np.int64)


@inline
def leave_gate(gate, me):
    """At a gated kernel's start: free the gate if thread ``me`` holds it."""
    if load_acquire(gate, 0) == me:
        store_release(gate, 0, -1)


@inline
def take_gate(gate, me):
    """At a gated kernel's end: take the gate for thread ``me``, spinning up to ``gate[1]`` turns while
    another thread holds it; without it after those turns.  Returns whether it was taken."""
    for _ in range(gate[1] if _SPIN else 0):
        holder = load_acquire(gate, 0)
        if holder == me or (holder < 0 and compare_exchange(gate, 0, -1, me) == -1):
            return True
        pause()
    return False


@inline
def _spin(flags, i, value, spins):
    for _ in range(spins if _SPIN else 0):
        seen = load_acquire(flags, i)
        if seen >= value or seen < 0:
            return seen
        pause()
    return load_acquire(flags, i)


@kernel
def wait_flag(flags, i, value, spins, gate, me):
    """Spin up to ``spins`` turns while ``0 <= flags[i] < value``; returns the flag's last value.  Gated
    (NOTE [ Turns at the GIL ]): the gate is taken only when the flag came, as a thread that gave up
    goes to sleep."""
    leave_gate(gate, me)
    seen = _spin(flags, i, value, spins)
    if seen >= value or seen < 0:
        take_gate(gate, me)
    return seen


@kernel
def raise_flag(flags, i, value):
    """``flags[i] = value``, after everything this thread wrote before."""
    store_release(flags, i, value)


@kernel
def add_in_turn(flags, k, total, g, blocks, spins, gate, me):
    """Once ``flags[0] == k`` (waiting up to ``spins`` turns): ``total += g`` over ``blocks`` (``total`` zeroed
    first when ``k == 0``), then ``flags[0] = k + 1``.  Returns ``k + 1`` when added, else the flag seen
    (a negative flag: stopped).  Gated as :func:`wait_flag` is.  The turn is passed on only if the flag
    still holds ``k``: a stop (``flags[0] = -1``) written while the add ran is never written over."""
    leave_gate(gate, me)
    seen = _spin(flags, 0, k, spins)
    if seen != k:
        if seen < 0:
            take_gate(gate, me)
        return seen
    if k == 0:
        total[:] = 0.0
    accumulate(total, g, blocks)
    seen = compare_exchange(flags, 0, k, k + 1)
    take_gate(gate, me)
    return k + 1 if seen == k else seen
