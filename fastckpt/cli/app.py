"""The ``fastckpt`` command.

``compare`` trains with and without checkpointing and reports; ``analyze`` and
``plan`` answer memory questions from the planner; ``profile`` writes a memray
flamegraph of training; ``train`` trains one net.

Every failure is one line on stderr, ``fastckpt <command>: error: <reason>``,
never a traceback (``FASTCKPT_DEBUG=1`` shows it).  Exit codes:

* 0: done;
* 1: training failed on valid input (divergence, out of memory), or a bug,
  which the line says, asking for a report;
* 2: bad input: arguments, data, files (checked before any training);
* 128 + signal: ``compare`` stopped by SIGINT (130), SIGTERM (143) or SIGHUP
  (129) after ending its child and writing the finished runs;
* 141 (128 + SIGPIPE): stdout was closed early (``fastckpt plan | head``),
  quietly, as ``cat`` or ``yes`` would end.  A command started with stdout
  closed (``>&-``) does its work, says once on stderr that its results are not
  shown, and exits as it would otherwise.

docs/misuse.md has the table of cases.
"""
import gc
import os
import signal
import sys
import warnings

from fastckpt.engine.loop import SkippedSamples
from fastckpt.engine.sharing import fix_threads
from fastckpt.parallel.mpi import launched_ranks
from fastckpt.report.compare import RunFailed, builtin_kinds

from . import commands, use
from .guard import leave_job
from .parser import commands_list, parser, settled
from .paths import check_paths
from .profile import profile
from .train import train


def main(argv=None):
    command = "fastckpt"
    try:
        if getattr(signal.getsignal(signal.SIGINT), "fastckpt_startup", False):   # loaded: SIGINT is ours to catch
            signal.signal(signal.SIGINT, signal.default_int_handler)
        _alone_or_a_rank(sys.argv[1:] if argv is None else list(argv))
        args = _parsed(argv)
        if args is None:                                           # a bare ``fastckpt``: what it can do, listed
            return 0
        command = f"fastckpt {args.command}"
        if sys.stdout is None:                                     # started with its output closed (>&-)
            sys.stdout = open(os.devnull, "w")
            _say(f"{command}: warning: standard output is closed; the results are not shown")
        warnings.showwarning = _warning_line(command)            # one line each, as errors are
        args = settled(args)
        if getattr(args, "blas_threads", None) is not None:        # NOTE [ Threads on a shared machine ]
            try:
                fix_threads(None if args.blas_threads == "auto" else args.blas_threads)
            except ValueError as exc:
                raise ValueError(f"--blas-threads: {exc}") from None
            os.environ["FASTCKPT_BLAS_THREADS"] = str(args.blas_threads)   # and the runs compare starts
        run = {"compare": commands.compare, "plan": commands.show_plan, "analyze": commands.analyze,
               "profile": profile, "train": train, "evaluate": use.evaluate, "predict": use.predict}
        check_paths(args)                                          # before any training
        code = run[args.command](args)
        sys.stdout.flush()                                         # a closed pipe shows here, not at exit
        return code
    except BrokenPipeError:
        # the reader left (``| head``): send what is still buffered nowhere, and end as SIGPIPE would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt:
        if os.environ.get("FASTCKPT_DEBUG"):
            raise
        if not leave_job(f"{command}: interrupted (SIGINT)", 130):
            _say(f"{command}: interrupted (SIGINT)")
        return 130
    except Exception as exc:
        if os.environ.get("FASTCKPT_DEBUG"):
            raise
        code, reason = _failure(exc, command)
        if not leave_job(f"{command}: error: {reason}", code):    # other MPI ranks may wait for this one
            _say(f"{command}: error: {reason}")
        return code


BUG = "(a bug: please report it; run with FASTCKPT_DEBUG=1 for the traceback)"


def _parsed(argv):
    """The parsed command line, or None once a bare ``fastckpt`` has listed the commands.  The parser's
    100 KiB of objects, which hold reference cycles, are freed here, not whenever the collector next runs
    (beside a run whose memory is predicted): made with the collector off, they are all still young."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        top = parser()
        args = top.parse_args(argv)
        if args.command is None:
            print(commands_list(top))
            return None
    finally:
        top = None
        gc.collect(0)
        if collecting:
            gc.enable()
    return args


SMALLER = {"fastckpt analyze": "--depths, --width or --batch-size"}   # what to shrink when memory runs out


def _alone_or_a_rank(argv):
    """Refuse, before anything else, to run beside other ranks of an mpiexec job as anything but a training
    rank: a command that ended there without an error (``plan``, ``--help``, ``--version``) would leave
    the job's training ranks waiting for it forever; an error ends the whole job."""
    ranks = launched_ranks()
    if ranks < 2:
        return
    words = [a.split("=")[0] for a in argv]
    if words[:1] == ["train"] and not any(flag in words for flag in ("-h", "--help", "--version")):
        return                              # a training rank, or one train refuses without its mode flag
    shown = " ".join(argv[:3]) + (" ..." if len(argv) > 3 else "")
    raise ValueError(f"'fastckpt {shown}' was started by mpiexec as one of {ranks} processes: only "
                     "train --mpi, --pipeline P or --tensor-parallel runs as a rank (run anything else "
                     "without mpiexec)")


def _failure(exc, command="fastckpt"):
    """(exit code, one-line reason) for an exception, or for a compare child's, by the builtin classes it is."""
    child = isinstance(exc, RunFailed)
    kinds = exc.kinds if child else builtin_kinds(exc)
    prefix = f"the {exc.run} run: " if child else ""
    reason = " ".join(str(exc.reason if child else exc).split()) or type(exc).__name__   # one line
    if "MemoryError" in kinds:
        return 1, f"{prefix}out of memory: {reason}; try a smaller {SMALLER.get(command, '--batch-size or --sizes')}"
    if "FloatingPointError" in kinds:
        return 1, f"{prefix}{reason}; try a smaller --eta"
    if kinds & {"ValueError", "TypeError", "OSError", "RuntimeError"}:
        return 2, prefix + reason
    if child:                               # a bug, its reason naming its type; or a death without a word
        return 1, f"{prefix}{reason} {BUG}" if kinds else prefix + reason
    return 1, f"{type(exc).__name__}: {reason} {BUG}"


def _warning_line(command):
    """``warnings.showwarning`` for the command: ``<command>: warning: <message>``, one line, no source."""
    def show(message, category, filename, lineno, file=None, line=None):
        text = message.what if isinstance(message, SkippedSamples) else " ".join(str(message).split())
        _say(f"{command}: warning: {text}")
    return show


def _say(line):
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:                                                 # stderr is gone too: nothing to tell
        pass


if __name__ == "__main__":
    sys.exit(main())
