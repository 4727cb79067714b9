"""Bytes outside the training step: evaluation and prediction in chunks of rows.

NOTE [ Inference bytes ]
``evaluate``/``predict``/``feedforward`` (fastckpt.engine.inference) run the net over at most
:data:`EVAL_CHUNK` rows at a time.  Per call they make: a staging buffer of the chunk's inputs in
the net's dtype (unless the data already is C-contiguous in it), two buffers of the chunk at the
widest layer that the layers alternate between, and a float64 scratch row.  ``predict`` holds its
int64 result for every row, ``feedforward`` its output for every row.  On top of these, at
different times: OpenBLAS's job table inside a forward GEMM that runs threaded (NOTE [ BLAS job
table ]), and after each chunk's forward pass ``evaluate``'s int64 arg-max and comparison of the
chunk; the larger of the two counts.  tests/test_compact.py holds memray's peak to this.
"""
import numpy as np

from fastckpt.core.resources import shown_bytes
from fastckpt.kernels import blas_core as current_blas_core
from fastckpt.kernels import blas_threads as current_blas_threads

from .costs import BLAS_JOB_BYTES, gemm_mallocs, scratch_bytes
from .units import format_bytes, parse_bytes

MiB = 2**20
EVAL_CHUNK = 1024          # rows per forward pass in evaluate() and predict(): GEMMs this tall run at full speed


def inference_bytes(sizes, n_rows, dtype=np.float64, *, staged=True, chunk=EVAL_CHUNK, what="evaluate",
                    blas_threads=None, core=None, labels=None):
    """The bytes one ``evaluate`` (or ``predict``, ``feedforward``) call on ``n_rows`` rows adds to the
    peak (NOTE [ Inference bytes ]); ``staged``: the data is not C-contiguous in ``dtype`` (Images are not);
    ``labels``: ``evaluate``'s labels, when known (one-hot rows are held as class indices through the call,
    and integer labels of another type than the arg-max's are cast a chunk at a time to compare)."""
    if what not in ("evaluate", "predict", "feedforward", "validate"):
        raise ValueError(f"what must be 'evaluate', 'validate', 'predict' or 'feedforward', got {what!r}")
    itemsize = np.dtype(dtype).itemsize
    rows = min(int(chunk), int(n_rows))
    widest = max(sizes[1:])
    total = (2 * rows * widest * itemsize + scratch_bytes(sizes)
             + (rows * sizes[0] * itemsize if staged else 0))
    if what == "predict":
        total += int(n_rows) * 8                        # every row's class (int64)
    elif what == "feedforward":
        total += int(n_rows) * sizes[-1] * itemsize     # every row's output
    threads = current_blas_threads() if blas_threads is None else blas_threads
    core = current_blas_core() if core is None else core
    blas = BLAS_JOB_BYTES if any(gemm_mallocs(m, n_out, n_in, False, True, core, threads)
                                 for m in {rows, int(n_rows) % rows or rows}
                                 for n_in, n_out in zip(sizes[:-1], sizes[1:])) else 0
    after = rows * 9 if what == "evaluate" else 0       # a chunk's int64 arg-max and its comparison
    if what == "validate":      # a validation set's loss and score: a few float64 sums (fastckpt.engine.scores)
        total += 8 * (3 * sizes[-1] if labels is not None and np.ndim(labels) > 1 else 2)
    elif what == "evaluate" and labels is not None:
        listed = not isinstance(labels, np.ndarray)
        shape, kind = listed_layout(labels) if listed else (labels.shape, labels.dtype)
        total += listed_bytes(labels) if listed else 0  # a list becomes an array for the call
        if len(shape) > 1:
            total += int(n_rows) * 8                    # one-hot rows: their arg-max, every row's class
        elif kind != np.intp:
            after += rows * 8                           # NumPy's buffer of a chunk's labels cast to int64
    return total + max(blas, after)


# NOTE [ The whole run ]
# A training run holds, besides the step's plan (parameters, gradients, activations, deltas, scratch,
# BLAS): the data; the staging rows a minibatch is converted into when the data is not already
# C-contiguous in the net's dtype (compact Images and integer labels always are converted); with a new
# order each epoch, that order (int64 per sample) and a minibatch gathered from the data in it; the
# records of :func:`record_bytes`; and after each epoch, one at a time, the evaluations of the test and
# the validation set (its loss and score, ``what="validate"``), each through its chunk's buffers (NOTE
# [ Inference bytes ]), or a save, which writes each array from where it is (numpy's writer copies at most
# 16 MiB of one array at a time).  Early stopping that restores the best weights keeps one copy of the
# parameters (``best weights``).
# The step's workspace lives through the run, so these add to it, but not to the step's BLAS job
# table, which lives only inside a GEMM.  Nothing else grows with the data, the batch or the updates:
# the minibatches are taken by their start (a ``range``, no object each), and the run keeps the
# Python objects of its net, plan and settings (:func:`object_bytes`), tens of KiB whatever the data.
# An optimizer's objects are SGD's (its state's bytes are the step's part): a step calls no ``list(...)``,
# whose list CPython allocates anew every time and, once freed, keeps on its free list (up to 80 of 56 bytes,
# which only ``[...]`` takes again): a list per update of the state's rows and of Adam's betas held 1.6-3.5 KB.
# ``fastckpt train`` loads its data first, beside nothing but its own objects: the loader holds the data, a
# chunk of reading and the file's arrays it converts (one-hot labels, say) until it returns
# (:func:`fastckpt.data.loading_bytes`), the part ``loading`` where that is more than the run adds.
# A strategy that searches for its tree plans before the step's buffers exist, beside the data, the parameters
# and the objects but the plan's ops: what its search held (``Plan.table_bytes``: ``revolve(k)``'s tables,
# ``budget``'s and ``fit``'s fronts, megabytes at a few hundred layers) is the part ``planning`` (by how much)
# where that is more than the run holds later.
# tests/test_whole_run.py holds memray's peak over a whole ``SGD`` and a whole ``fastckpt train`` to this.
NOT_AT_ONCE = "not held at once"   # run_bytes' part taking off the step's BLAS table (with a gathered minibatch),
                                  # an evaluation and a save but the largest: they are never held together,
                                  # so the parts add up to the total
# The Python objects a run makes of its net, engine, plan and settings (views, the op list, the tables' array
# objects, the command's namespace and result): a few KiB of base and a few hundred bytes per layer and per op
# of the plan.  memray counts them one by one; measured on CPython 3.11 for nets of 3 to 97 layers and plans of
# 7 to 926 ops (plain, sqrt, revolve, the optimizer in backward), and counted here at the most they came to.
# Some runs came to 4.4 KiB more than the most seen before (2026-11-29, the same run 1 time in 3: CPython's
# free lists and allocator pools), so the base holds 8 KiB more.  A 300-layer net's ``fastckpt train`` came to
# 430 bytes a layer more (its evaluation's engine, its parameters' views), so a layer counts 1,700.
OBJECTS_BASE, OBJECTS_PER_LAYER, OBJECTS_PER_OP = 28 * 1024, 1700, 290
OBJECTS_COMMAND = 52 * 1024      # the command's own besides: its parsed arguments, its result, its data's names
UPDATE_BYTES = 32 + 24 + 24   # per update: its RSS (an int below 2**60) and time in the lab's lists, its loss
EPOCH_BYTES = 5 * 24          # per epoch: its rate, mean loss, accuracy, validation loss and score in
HISTORY_LISTS = 5             # ``net.history``'s five lists
SAVE_EXTRA = 64 * 1024        # the zip archive's buffers and the metadata of one save


def list_slots(n):
    """The slots of a Python list after ``n`` appends: CPython's growth rule (``list_resize``)."""
    slots = 0
    while slots < n:
        slots = (slots + 1 + ((slots + 1) >> 3) + 6) & ~3
    return slots


def record_bytes(updates, epochs=1):
    """What a run of ``updates`` updates over ``epochs`` epochs records: the lab's two lists of every update's
    RSS and time, the last epoch's list of losses, and ``net.history``'s lists, slots included."""
    updates, epochs = int(updates), max(1, int(epochs))
    per_epoch = updates // epochs
    return (updates * (UPDATE_BYTES - 24) + per_epoch * 24 + 8 * (2 * list_slots(updates) + list_slots(per_epoch))
            + epochs * EPOCH_BYTES + 8 * HISTORY_LISTS * list_slots(epochs))


def data_bytes(*arrays):
    """What the data holds: an ndarray's or :class:`~fastckpt.data.images.Images`' own bytes; for a list
    (of rows or numbers), the bytes of its numbers as an array (Python's objects around them aside,
    :func:`listed_bytes`)."""
    return sum(int(a.nbytes) if hasattr(a, "nbytes") else listed_bytes(a) for a in arrays if a is not None)


def listed_bytes(rows):
    """The bytes ``np.asarray(rows)`` would hold, found without making it (:func:`listed_layout`)."""
    shape, dtype = listed_layout(rows)
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def listed_layout(rows):
    """The shape and type ``np.asarray(rows)`` would have, found a row at a time without making it: each row's
    shape and type (an array's own, else those of the row alone as an array, the one copy of a row at a time),
    the first row's shape for every row (the checks refuse ragged data) and the type they all promote to."""
    shape, types = None, set()
    for row in rows:
        if not (hasattr(row, "shape") and hasattr(row, "dtype")):
            row = np.asarray(row)                        # a number, or a list of them: one row
        shape = row.shape if shape is None else shape
        types.add(row.dtype)
    if shape is None:
        return (0,), np.dtype(np.float64)
    return (len(rows), *shape), np.result_type(*types)


def staged(a, dtype):
    """Whether a minibatch of ``a`` is converted into staging rows (it is not C-contiguous ``dtype`` rows)."""
    return not (isinstance(a, np.ndarray) and a.dtype == np.dtype(dtype) and a.flags.c_contiguous)


def staging_bytes(plan, x, y):
    """The staging rows a minibatch of ``x`` and ``y`` (the data, or its rows) is converted into for a step
    of ``plan``: none for C-contiguous rows of the net's dtype; a minibatch of compact images and integer
    labels (what the commands read) always is converted."""
    rows, item = plan.batch_size, plan.dtype.itemsize
    return (rows * plan.sizes[0] * item if staged(x, plan.dtype) else 0) + \
        (rows * plan.sizes[-1] * item if staged(y, plan.dtype) else 0)


def object_bytes(plan, command=False, ops=True):
    """The Python objects of a run of ``plan``: its net, engine, plan and settings (:data:`OBJECTS_BASE`), and
    with ``command`` those of ``fastckpt train``; without ``ops``, before the plan's ops are made."""
    return OBJECTS_BASE + OBJECTS_COMMAND * bool(command) + OBJECTS_PER_LAYER * plan.n_layers + \
        OBJECTS_PER_OP * len(plan.ops) * bool(ops)


def run_bytes(plan, training, test=None, *, updates, save=False, epochs=1, validation=None, shuffled=False,
              command=False, best=False, loading=0):
    """The bytes a whole training run holds at its peak, by part (NOTE [ The whole run ]).

    ``plan`` is the step's; ``training``, ``test`` and ``validation`` the (x, y) pairs the run reads (a
    validation set held out of the training data is given as both parts, views of it); ``updates`` how many
    updates it makes over ``epochs``; ``save``: whether it saves the net after each epoch; ``shuffled``:
    each epoch takes the minibatches in a new order; ``command``: the run is ``fastckpt train``'s (its Python
    objects, :func:`object_bytes`); ``best``: early stopping keeps the best epoch's weights; ``loading``: what
    the data's loader held besides the data, before the run (:func:`fastckpt.data.loading_bytes`), a part (by
    how much) where it is more than the run adds to the data and its objects.  Returns an ordered dict whose
    last entry, ``total``,
    is the peak: the sum of the entries before it but those of the step's parts (``step: total`` is their
    sum), one of which, ``not held at once`` (zero or negative), takes off the step's BLAS job table (with
    a minibatch gathered for it), the evaluation and the save but the largest of them, since the three are
    never held together.
    """
    (x, y), dtype, sizes = training, plan.dtype, plan.sizes
    parts = {"data": data_bytes(x, y, *(test or ()), *(validation or ()))}
    parts.update({f"step: {k}": v for k, v in plan.bytes().items() if k != "activation_memory"})
    batch, item = plan.batch_size, dtype.itemsize
    parts["staging"] = staging_bytes(plan, x, y)
    if shuffled:        # the epoch's order (lists made arrays to take rows by it), and a minibatch gathered
        parts["order"] = len(x) * 8 + sum(data_bytes(a) for a in (x, y) if isinstance(a, list))
        parts["gathered"] = data_bytes(x[:batch], y[:batch])
    parts["records"] = record_bytes(updates, epochs)
    parts["python objects"] = object_bytes(plan, command)
    if best:
        parts["best weights"] = plan.bytes()["parameters"]
    after = []
    evaluations = [inference_bytes(sizes, len(pair[0]), dtype, staged=staged(pair[0], dtype), labels=pair[1],
                                   blas_threads=plan.blas_threads, what=what)
                   for pair, what in ((test, "evaluate"), (validation, "validate")) if pair is not None]
    if evaluations:                   # the test set's, then the validation set's: the larger counts
        parts["evaluation"] = max(evaluations)
        after.append(parts["evaluation"])
    if save:
        largest = max(n_out * n_in for n_in, n_out in zip(sizes[:-1], sizes[1:])) * item
        parts["saving"] = min(largest, 16 * 2**20) + SAVE_EXTRA
        after.append(parts["saving"])
    # the step's BLAS job table lives only inside its GEMMs, and a gathered minibatch only through its step:
    # never during an evaluation or a save, and those two come one at a time: the largest counts, and the
    # others are taken off again
    during = parts["step: blas"] + parts.get("gathered", 0)
    parts[NOT_AT_ONCE] = max([during, *after]) - during - sum(after)
    total = parts["data"] + parts["step: total"] + parts["staging"] + parts.get("order", 0) + \
        parts["python objects"] + parts.get("best weights", 0) + \
        parts.get("gathered", 0) + parts["records"] + sum(after) + parts[NOT_AT_ONCE]
    beyond = int(loading) - (total - parts["data"] - parts["python objects"])
    if beyond > 0:          # before the run, beside the data and objects alone: counted where it is the larger
        parts["loading"] = beyond
        total += beyond
    tables = plan.table_bytes
    planning = parts["data"] + parts["step: parameters"] + parts["step: optimizer_state"] + tables - total + \
        object_bytes(plan, command, ops=False)          # the optimizer's state is made with the net, before its plan
    if tables and planning > 0:     # the search's tables, before the step's buffers: where they are the larger
        parts["planning"] = planning
        total += planning
    parts["total"] = total
    return parts


def largest_batch(sizes, bound, training, test=None, *, dtype=np.float64, strategy="plain", epochs=1,
                  optimizer_in_backward=False, optimizer="sgd", save=False, command=False, loading=0):
    """The largest batch (at most the training samples) whose whole run with ``strategy`` fits ``bound`` bytes,
    as ``(batch, plan, parts)`` (:func:`run_bytes`, ``command``: a run of ``fastckpt train``, ``loading``: what
    loading its data holds besides it), or None when not even batch 1 fits.

    The whole run grows with the batch (the result lists shrink by less than a minibatch's staging rows
    grow), so the largest batch is found by bisection; tests/test_whole_run.py checks it against a scan."""
    from .plan import plan as make_plan
    refuse_under_mkl("bound", bound)
    n = len(training[0])

    def run(b):
        p = make_plan(sizes, b, dtype, strategy, optimizer_in_backward=optimizer_in_backward, optimizer=optimizer)
        return p, run_bytes(p, training, test, updates=epochs * (n // b), save=save, epochs=epochs, command=command,
                            loading=loading)

    def fits(b):
        return run(b)[1]["total"] <= bound
    if not fits(1):
        return None
    low, high = 1, n
    if not fits(high):
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if fits(mid) else (low, mid)
        high = low
    return (high, *run(high))


# NOTE [ MKL's own buffers ]
# MKL (FASTCKPT_BLAS=mkl) keeps the packing buffers of its GEMMs for the life of the process and grows them when
# a larger GEMM shape first runs: on a 2-core AMD EPYC Zen 5 (MKL 2026.2, 2 threads), the forward GEMM
# (m x 256) @ (256 x 256)^T took 0.8 MB at m = 64, 3.2 MB at 1,024 and 21.6 MB from 16,384 rows; a (10 x 40) @
# (40 x 64)^T took 52 KB or 104 KB by how the two threads met.  Their sizes follow rules of MKL's own that are not
# published and depend on thread timing, so the step's plan counts none of them (exact once the process has run
# the step's shapes: tests/test_blas_backends.py), and a bound on the whole run cannot be kept: it is refused.
def refuse_under_mkl(name, bound, what="a bound on the whole run", shown=None):
    """A ValueError naming ``name`` and ``bound`` (or ``shown``) when the kernels call MKL, whose buffers no
    plan can bound (NOTE [ MKL's own buffers ])."""
    if current_blas_core() == "mkl":
        raise ValueError(f"{shown or f'{name} {format_bytes(bound)}'}: {what} holds with OpenBLAS only; MKL "
                         "(FASTCKPT_BLAS=mkl) keeps GEMM buffers of its own, megabytes that no plan can count; run "
                         "with FASTCKPT_BLAS=openblas to bound the run")


FIT_TRIES = 8          # plans fit_the_run tries before it takes the least step any schedule needs


def fit_the_run(sizes, batch_size, dtype, bound, training, test=None, *, updates, save=False,
                optimizer_in_backward=False, optimizer="sgd", name="max_memory", extra=0, **around):
    """``Fit`` of what ``bound`` bytes leave the step once the rest of the whole run is counted (the data,
    staging rows, result lists and the larger of an evaluation and a save, and ``extra`` bytes the caller
    holds besides; ``around``: :func:`run_bytes`' ``epochs``, ``validation``, ``shuffled``, ``command`` and
    ``loading``): a step planned with it keeps the whole run within ``bound``.  A ValueError naming ``name``
    and each part when the run cannot fit."""
    from .plan import plan as make_plan
    from .strategies import Fit, InfeasiblePlan
    refuse_under_mkl(name, bound)

    def planned(strategy):
        return make_plan(sizes, batch_size, dtype, strategy, optimizer_in_backward=optimizer_in_backward,
                         optimizer=optimizer)

    def whole(p):
        return run_bytes(p, training, test, updates=updates, save=save, **around)["total"] + extra
    rest = run_bytes(planned("plain"), training, test, updates=updates, save=save, **around)
    if around.get("loading"):
        refuse_loading(name, bound, rest, around["loading"], extra)
    if rest["total"] + extra <= bound:         # every activation kept fits: the least recomputation of all
        return Fit(rest["step: total"])
    others = rest["data"] + rest["staging"] + rest.get("order", 0) + rest["records"] + rest["python objects"] + \
        rest.get("best weights", 0) + extra
    # beside the step: a gathered minibatch during it, or after it an evaluation or a save, which its BLAS
    # job table (the same for every plan of these sizes) does not meet
    beside = max(rest.get("gathered", 0), rest.get("evaluation", 0) - rest["step: blas"],
                 rest.get("saving", 0) - rest["step: blas"])
    parts = _shown_parts(rest, extra)
    budget, tried = bound - others - beside, {rest["step: total"]: rest["total"] + extra}
    if budget <= 0:
        raise ValueError(f"{name} {format_bytes(bound)}: the whole run needs more than {shown_bytes(others + beside)} "
                         f"before its training step: {parts}")
    for _ in range(FIT_TRIES):       # a plan that recomputes has more ops, so more Python objects: take them off
        try:
            fitted = planned(Fit(budget))
        except InfeasiblePlan:
            break
        step, total = fitted.bytes()["total"], whole(fitted)
        if total <= bound:
            return Fit(budget)
        tried[step] = total
        budget = step - (total - bound)        # a step smaller by what the run is over: another plan
        if budget <= 0:
            break
    least = least_step(planned)
    needs = f"{name} {format_bytes(bound)}: the whole run needs"
    at_least = min(others + beside + least, *tried.values())     # the runs tried, plain's among them
    if at_least > bound:
        raise ValueError(f"{needs} at least {at_least} bytes ({shown_bytes(at_least)}): {parts}, and the least "
                         f"training step {shown_bytes(least)}")
    try:
        tried[least] = whole(planned(Fit(least)))
    except InfeasiblePlan:                   # past ~1,400 layers the least is a lower bound (NOTE [ Planning bounds ])
        raise ValueError(f"{needs} more than {shown_bytes(others + beside + least)}: {parts}, and a training step "
                         f"of more than {shown_bytes(least)} (at this depth the exact least is too long a search)"
                         ) from None
    if tried[least] <= bound:
        return Fit(least)
    raise ValueError(none_fits(name, bound, tried, least, parts))


def _shown_parts(rest, extra):
    """The parts of a whole run beside its step, in words, for a refusal."""
    parts = ", ".join(f"{part} {shown_bytes(value)}" for part, value in rest.items()
                      if part in ("data", "staging", "order", "gathered", "records", "python objects", "evaluation",
                                  "saving", "best weights", "loading"))
    return parts + (f", besides {shown_bytes(extra)}" if extra else "")


def none_fits(name, bound, tried, least, parts):
    """Why ``fit_the_run`` found no step: ``tried`` maps each step's bytes to its whole run's, none within
    ``bound``, ``least`` among them."""
    step, total = min(tried.items(), key=lambda item: (item[1], item[0]))
    return (f"{name} {format_bytes(bound)}: none of the training steps tried keeps the whole run within it, the "
            f"least any schedule needs ({least} bytes) included: a plan that recomputes more holds more Python "
            f"objects. The least whole run found needs {total} bytes ({shown_bytes(total)}), {total - bound} more, "
            f"with a step of {step} bytes; tried: "
            + ", ".join(f"a step of {s} bytes makes the run {t}" for s, t in sorted(tried.items(), reverse=True))
            + f"; the rest: {parts}")


def least_step(planned):
    """The fewest bytes any schedule's training step needs, from ``planned`` (a strategy -> its plan)."""
    from .strategies import Fit, InfeasiblePlan
    try:
        return planned(Fit(1)).bytes()["total"]       # no step fits one byte: InfeasiblePlan says the least
    except InfeasiblePlan as exc:
        return exc.minimum_bytes


def refuse_loading(name, bound, parts, loading, extra=0):
    """A ValueError naming ``name`` and ``bound`` when loading the data does not fit it: the data, what its
    loader holds besides (``loading``), the run's Python objects (of ``parts``) and ``extra``."""
    loaded = parts["data"] + parts["python objects"] + loading + extra
    if loaded > bound:
        raise ValueError(f"{name} {format_bytes(bound)}: loading the data needs {shown_bytes(loaded)}: data "
                         f"{shown_bytes(parts['data'])}, its loader's reading and conversions {shown_bytes(loading)}"
                         f", python objects {shown_bytes(parts['python objects'])}"
                         + (f", besides {shown_bytes(extra)}" if extra else ""))


def bound_the_run(plan, training, test=None, *, updates, bound, name="max_memory", held=None, extra=0, **around):
    """The whole run's parts (:func:`run_bytes`) when its predicted peak is within ``bound`` (bytes, or a
    string such as ``"256MiB"``); else a ValueError naming ``name``, the parts, and the ``fit`` strategy
    whose step would keep the run within the bound (when one would).  ``held``: every array the caller keeps for
    the run (the data before a validation split, a validation set, class indices made of one-hot validation rows),
    counted whole instead of ``training``, ``test`` and ``validation``; ``extra``: bytes the caller holds
    besides; ``around``: :func:`run_bytes`' ``epochs``, ``validation``, ``shuffled`` and ``best``."""
    bound = parse_bytes(bound, name)
    refuse_under_mkl(name, bound)
    parts = run_bytes(plan, training, test, updates=updates, **around)
    extra += data_bytes(*held) - parts["data"] if held is not None else 0
    if extra:
        parts["besides"] = extra
        parts["total"] += extra
    if parts["total"] <= bound:
        return parts
    fit = fit_the_run(plan.sizes, plan.batch_size, plan.dtype, bound, training, test, updates=updates,
                      optimizer_in_backward=plan.optimizer_in_backward, optimizer=plan.optimizer, name=name,
                      extra=extra, **around)
    shown = ", ".join(f"{part} {shown_bytes(parts[part])}" for part in
                      ("data", "step: total", "staging", "order", "records", "evaluation", "best weights", "besides",
                       "planning")
                      if part in parts)
    raise ValueError(f"{name} {format_bytes(bound)}: this run needs {shown_bytes(parts['total'])} with strategy "
                     f"{plan.strategy} ({shown}); strategy='{fit}' plans a step that keeps it within the bound")
