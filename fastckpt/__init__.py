"""fastckpt: fast CPU training of MLPs, with gradient checkpointing.

``from fastckpt import Network, NetworkWithCheckpointing`` replaces the lab classes.
The layers beneath this facade are drawn in docs/architecture.md.
"""
import os as _os
import signal as _signal
import sys as _sys


def _interrupted_while_starting(signum, frame):
    """SIGINT while the command still loads (NumPy, Numba, the kernels: about a second): the command's one line
    and exit 130, as later; ``fastckpt.cli.main`` gives SIGINT back to Python as its first step.  A rank that
    mpiexec started beside others ends the job (``MPI_Abort``), which would otherwise wait for it forever."""
    ranks = next((int(v) for v in map(_os.environ.get, ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE"))
                  if v and v.isdigit()), 1)
    if ranks < 2:
        _os.write(2, b"fastckpt: interrupted (SIGINT)\n")
        _os._exit(130)
    try:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        _os.write(2, f"fastckpt: interrupted (SIGINT) (rank {comm.Get_rank()} of {comm.Get_size()}; ending the "
                     "job)\n".encode())
        comm.Abort(130)
    except ImportError:                      # no mpi4py: the other processes cannot be in MPI either
        _os.write(2, b"fastckpt: interrupted (SIGINT)\n")
    _os._exit(130)


_interrupted_while_starting.fastckpt_startup = True
_argv = getattr(_sys, "orig_argv", [])
_CLI = _os.path.basename(_sys.argv[0]) == "fastckpt" or "-m" in _argv and _argv[_argv.index("-m") + 1:][:1] == \
    ["fastckpt"]
if _CLI and _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:   # not where SIGINT is ignored
    _signal.signal(_signal.SIGINT, _interrupted_while_starting)

try:                                         # the BLAS is chosen as the kernels load (FASTCKPT_BLAS)
    from . import kernels as _kernels  # noqa: F401
except ImportError as _exc:
    _cli = _CLI or _sys.argv[0] in ("-m", "") or _sys.argv[0].endswith(_os.path.join("fastckpt", "__main__.py"))
    if type(_exc).__name__ == "BlasChoiceError" and _cli:
        _sys.stderr.write(f"fastckpt: error: {_exc}\n")         # the command line's one line, exit 2
        raise SystemExit(2) from None
    raise

from . import optimizers  # noqa: E402 (after the start-up's SIGINT handler)
from ._version import __version__  # noqa: E402
from .core.params import Parameters  # noqa: E402
from .data import load_mnist  # noqa: E402
from .engine import Engine  # noqa: E402
from .engine.stopping import EarlyStopping  # noqa: E402
from .nets import Network, NetworkWithCheckpointing, load  # noqa: E402
from .planner import InfeasiblePlan, Plan, plan, strategies  # noqa: E402

__all__ = ["EarlyStopping", "Engine", "InfeasiblePlan", "Network", "NetworkWithCheckpointing", "Parameters", "Plan",
           "__version__", "load", "load_mnist", "optimizers", "plan", "strategies"]
