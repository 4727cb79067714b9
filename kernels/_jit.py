"""JIT flags for every kernel, in one place.

No ``fastmath``: recomputed activations must be bit-identical to the first
forward pass, and NaN/inf checks must survive optimisation.
"""
import numba

#: Compiled once and cached on disk, GIL released so threads can run kernels at once.
kernel = numba.njit(nogil=True, cache=True, error_model="numpy", boundscheck=False)

#: Small helpers that are inlined into the kernels that call them.
inline = numba.njit(nogil=True, cache=True, error_model="numpy", inline="always")
