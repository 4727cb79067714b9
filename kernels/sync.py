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

NOTE [ No JIT ] (:mod:`kernels.bits`): without the JIT these are Python
functions that look once and never spin, as a spinning Python loop would hold
the GIL that the thread it waits for needs.
"""
from numba import config, types

from ._jit import kernel
from .elementwise import accumulate

_SPIN = not config.DISABLE_JIT              # a constant to the compiler

if config.DISABLE_JIT:
    def load_acquire(flags, i):
        return flags[i]

    def store_release(flags, i, value):
        flags[i] = value

    def pause():
        pass
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
    def pause(typingctx):
        """x86's ``pause``: a spinning core yields to its sibling and leaves the loop without a stall."""
        def codegen(context, builder, signature, args):
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse2.pause")
            builder.call(fn, [])
            return context.get_dummy_value()
        return types.void(), codegen


@kernel
def wait_flag(flags, i, value, spins):
    """Spin up to ``spins`` turns while ``0 <= flags[i] < value``; returns the flag's last value."""
    for _ in range(spins if _SPIN else 0):
        seen = load_acquire(flags, i)
        if seen >= value or seen < 0:
            return seen
        pause()
    return load_acquire(flags, i)


@kernel
def raise_flag(flags, i, value):
    """``flags[i] = value``, after everything this thread wrote before."""
    store_release(flags, i, value)


@kernel
def add_in_turn(flags, k, total, g, blocks, spins):
    """Once ``flags[0] == k`` (waiting up to ``spins`` turns): ``total += g`` over ``blocks`` (``total`` zeroed
    first when ``k == 0``), then ``flags[0] = k + 1``.  Returns ``k + 1`` when added, else the flag seen
    (a negative flag: stopped)."""
    seen = wait_flag(flags, 0, k, spins)
    if seen != k:
        return seen
    if k == 0:
        total[:] = 0.0
    accumulate(total, g, blocks)
    store_release(flags, 0, k + 1)
    return k + 1
