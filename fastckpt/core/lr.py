"""Learning-rate schedules: the ``eta`` of each epoch, from the ``eta`` a training run is given.

The epoch ``e`` counts from 0 over the whole run (a resumed run goes on counting), and
the formulas are the closed forms of PyTorch's epoch-wise schedulers:

* :class:`Constant` (``"constant"``, the default, the lab's): ``eta``.
* :class:`StepDecay` (``"step(N)"``, ``"step(N, gamma)"``): ``eta * gamma ** floor(e / N)``,
  ``torch.optim.lr_scheduler.StepLR(step_size=N, gamma=gamma)``, gamma 0.1 by default.
* :class:`Cosine` (``"cosine"``, ``"cosine(T)"``, ``"cosine(T, eta_min)"``):
  ``eta_min + (eta - eta_min) * (1 + cos(pi * e / T)) / 2``,
  ``torch.optim.lr_scheduler.CosineAnnealingLR(T_max=T, eta_min=eta_min)``; ``T``
  defaults to the run's last epoch + 1 (the epochs of the run, resumed ones included), and
  past ``T`` the rate stays at ``eta_min``.
* :class:`InverseScaling` (no spelling: made by :mod:`fastckpt.sklearn`):
  ``eta / (t + 1) ** power_t`` with ``t`` the samples trained on before the epoch, scikit-learn's
  ``learning_rate="invscaling"``, which it updates once per epoch.

Each schedule's rate is monotone in the epoch (constant, decaying or growing by ``gamma``,
or annealing from ``eta`` to ``eta_min`` and staying there), so the first and the last epoch
of a run bound every rate in between: :meth:`LRSchedule.check_rates` refuses a run one of
whose epochs would get a rate that is not a finite float before its first epoch trains.
"""
import math
import re
import sys

from .checks import check_nonnegative, check_positive_int


class LRSchedule:
    """Base class: :meth:`rate` gives an epoch's learning rate."""

    name = ""

    def settings(self):
        return ()

    def rate(self, eta, epoch, epochs):
        """The learning rate of epoch ``epoch`` (from 0) of a run of ``epochs`` in all, from ``eta``."""
        return eta

    def resolved(self, epochs):
        """This schedule with every default that depends on the run's length fixed for ``epochs``."""
        return self

    def check_rates(self, eta, first_epoch, epochs, name="lr_schedule"):
        """Refuse, with a ValueError naming ``name``, a run of epochs ``first_epoch .. first_epoch + epochs - 1``
        (of ``first_epoch + epochs`` in all) one of whose rates from ``eta`` overflows or is not finite; every
        rate is known before the first epoch, and the ends bound the rest (the rates are monotone)."""
        last = first_epoch + epochs
        for epoch in sorted({first_epoch, last - 1}) if epochs >= 1 else ():
            try:
                rate = float(self.rate(eta, epoch, last))
            except OverflowError:
                rate = math.inf
            if not math.isfinite(rate):          # epochs counted from 1 here, as the command line's lines count them
                raise ValueError(f"{name} {self} from eta {eta!r} gives epoch {epoch + 1}/{last} a learning rate of "
                                 f"{rate}, beyond what a float holds; nothing was trained")

    def __str__(self):
        args = ", ".join(repr(v) if isinstance(v, float) else str(v) for v in self.settings())
        return f"{self.name}({args})" if args else self.name

    __repr__ = __str__

    def __eq__(self, other):
        return isinstance(other, LRSchedule) and str(other) == str(self)

    def __hash__(self):
        return hash(str(self))


class Constant(LRSchedule):
    """``eta`` every epoch (the lab's)."""

    name = "constant"


class StepDecay(LRSchedule):
    """``eta * gamma ** (epoch // step_size)``: PyTorch's ``StepLR``."""

    name = "step"

    def __init__(self, step_size, gamma=0.1):
        self.step_size = check_positive_int(step_size, "step(step_size)")
        self.gamma = check_nonnegative(gamma, "step(gamma)")

    def settings(self):
        return (self.step_size, self.gamma)

    def rate(self, eta, epoch, epochs):
        steps = epoch // self.step_size
        try:
            factor = self.gamma ** steps
        except OverflowError:
            factor = math.inf
        if sys.float_info.min <= factor < math.inf:
            return eta * factor                  # PyTorch's closed form, whenever gamma ** steps is a normal float
        if eta == 0 or self.gamma == 0:
            return 0.0
        return times_power(eta, self.gamma, steps)


def times_power(x, base, k):
    """``x * base ** k`` (``x``, ``base`` > 0, ``base`` != 1, ``k`` >= 0) with the binary exponents kept apart from
    the mantissas, so that a ``base ** k`` past float64 (1e200 ** 2) never overflows or underflows on the way to
    a product a float holds (1e-300 * 1e200 ** 2 = 1e100); inf only when the product itself is past float64.
    ``base ** k`` is taken in powers of at most 2**1000 each: at most three of them come between any float
    and one past float64's range, where the product stops."""
    m, e = math.frexp(x)
    chunk = max(1, int(1000 / abs(math.log2(base))))
    while k and -1200 < e < 1200:
        n = min(k, chunk)
        power, shift = math.frexp(base ** n)
        m, more = math.frexp(m * power)
        e += shift + more
        k -= n
    try:
        return math.ldexp(m, e)
    except OverflowError:                       # as a float product past float64 is
        return math.inf


class Cosine(LRSchedule):
    """``eta_min + (eta - eta_min) (1 + cos(pi epoch / T)) / 2``: PyTorch's ``CosineAnnealingLR``, ``eta_min``
    from epoch ``T`` on; ``T`` None: the run's epochs."""

    name = "cosine"

    def __init__(self, epochs=None, eta_min=0.0):
        self.epochs = None if epochs is None else check_positive_int(epochs, "cosine(epochs)")
        self.eta_min = check_nonnegative(eta_min, "cosine(eta_min)")

    def settings(self):
        if self.epochs is None:
            return ()
        return (self.epochs, self.eta_min) if self.eta_min else (self.epochs,)

    def resolved(self, epochs):
        return self if self.epochs is not None else Cosine(max(1, epochs), self.eta_min)

    def rate(self, eta, epoch, epochs):
        period = self.epochs or max(1, epochs)
        if epoch >= period:
            return self.eta_min
        # halved before the product, not after: (eta - eta_min) * 2 overflows for an eta near float64's largest
        return self.eta_min + (eta - self.eta_min) * ((1.0 + math.cos(math.pi * epoch / period)) / 2.0)


class InverseScaling(LRSchedule):
    """``eta / (t + 1) ** power_t``, ``t = samples_before + (epoch - first_epoch) * samples_per_epoch`` the
    samples trained on before the epoch: scikit-learn's ``learning_rate="invscaling"``.  With ``fresh`` the
    first epoch runs at ``eta`` whatever was trained before: a warm fit of scikit-learn's makes a new optimizer,
    whose rate is ``learning_rate_init`` until its first epoch ends."""

    name = "invscaling"

    def __init__(self, power_t, samples_per_epoch, samples_before=0, first_epoch=0, fresh=False):
        self.power_t = check_nonnegative(power_t, "power_t")
        self.samples_per_epoch = check_positive_int(samples_per_epoch, "samples_per_epoch")
        self.samples_before = check_positive_int(samples_before, "samples_before", minimum=0)
        self.first_epoch = check_positive_int(first_epoch, "first_epoch", minimum=0)
        self.fresh = bool(fresh)

    def settings(self):
        return (self.power_t, self.samples_per_epoch, self.samples_before, self.first_epoch, self.fresh)

    def rate(self, eta, epoch, epochs):
        if self.fresh and epoch == self.first_epoch:
            return eta
        seen = self.samples_before + (epoch - self.first_epoch) * self.samples_per_epoch
        return eta / float(seen + 1) ** self.power_t


SCHEDULES = {"constant": Constant, "step": StepDecay, "cosine": Cosine}
_SPELLING = re.compile(r"^\s*([a-z]+)\s*(?:\(([^()]*)\))?\s*$")


def parse_lr_schedule(spec):
    """An :class:`LRSchedule` from itself, None (constant) or its spelling: ``"constant"``, ``"step(10)"``,
    ``"step(10, 0.5)"``, ``"cosine"``, ``"cosine(20)"``, ``"cosine(20, 0.001)"``."""
    if spec is None:
        return Constant()
    if isinstance(spec, LRSchedule):
        return spec
    match = _SPELLING.match(spec) if isinstance(spec, str) else None
    cls = SCHEDULES.get(match.group(1)) if match else None
    if cls is None:
        raise ValueError(f"lr_schedule must be constant, step(N[, gamma]) or cosine[(T[, eta_min])], got {spec!r}")
    args = [a.strip() for a in match.group(2).split(",")] if match.group(2) not in (None, "") else []
    most = {Constant: 0, StepDecay: 2, Cosine: 2}[cls]
    if len(args) > most or (cls is StepDecay and not args):
        raise ValueError(f"lr_schedule must be constant, step(N[, gamma]) or cosine[(T[, eta_min])], got {spec!r}")
    try:
        values = [int(a) if k == 0 and cls is not Constant else float(a) for k, a in enumerate(args)]
        return cls(*values)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"lr_schedule {spec!r}: {exc}") from None
