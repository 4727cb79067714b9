"""Pipeline stages without MPI: schedules, the live set of a micro-batch, stage chains, the partition.

The MPI jobs themselves are in test_pipeline_mpi.py.
"""
import itertools

import numpy as np
import pytest

import fastckpt
from fastckpt.core.activations import state_codes
from fastckpt.parallel.pipeline.links import SEND_BUFFERS
from fastckpt.parallel.pipeline.partition import balance, choose_partition
from fastckpt.parallel.pipeline.schedules import in_flight, pending_weights, schedule, storage_slots
from fastckpt.parallel.pipeline.stage import Stage

STRATEGIES = ["plain", "every_nth(2)", "sqrt", "revolve(1)", "revolve(2)", "segments(1)"]


@pytest.mark.parametrize("kind", ["gpipe", "1f1b", "zb1"])
def test_every_micro_batch_goes_forward_then_backward_once(kind):
    for stages, micro in itertools.product(range(1, 6), range(1, 9)):
        for s in range(stages):
            order = schedule(kind, s, stages, micro)
            passes = ("F", "B", "W") if kind == "zb1" else ("F", "B")
            assert sorted(order) == sorted((op, k) for op in passes for k in range(micro))
            assert [k for op, k in order if op == "F"] == list(range(micro))
            for k in range(micro):
                assert order.index(("F", k)) < order.index(("B", k))
                if kind == "zb1":
                    assert order.index(("B", k)) < order.index(("W", k))
            if kind == "zb1":    # B and W in the same order, so the gradients add up as 1F1B's do
                assert [k for op, k in order if op == "W"] == [k for op, k in order if op == "B"]
                # 1F1B's forwards and backwards; the first s W's put off to the end
                assert [p for p in order if p[0] != "W"] == schedule("1f1b", s, stages, micro)
                assert pending_weights(order) == min(s + 1, micro)
                assert in_flight(order) == min(stages - s, micro)
                held, most = 0, 0                        # between F and W: at most P, 1F1B's first stage's
                for op, _ in order:
                    held += {"F": 1, "W": -1}.get(op, 0)
                    most = max(most, held)
                assert most <= min(stages, micro)
                continue
            assert pending_weights(order) == 0
            bound = micro if kind == "gpipe" else min(stages - s, micro)
            assert in_flight(order) == bound
            # GPipe: all but the last forward's; 1F1B: a backward restores the oldest while the newest
            # waits too, except on the last stage (each backward follows its forward)
            if kind == "gpipe":
                expected = micro - 1
            else:
                expected = 0 if s == stages - 1 or micro == 1 else min(stages - s, micro)
            assert storage_slots(order) == expected, (kind, s, stages, micro)


def _runs_to_the_end(kind, stages, micro, pool=None):
    """Play the job as MPI would: a receive waits for its message, a send waits only for its pool
    buffer (the send ``pool`` earlier on that link must have been received; by default
    PipelineTrainer's ``SEND_BUFFERS``; 0: blocking sends).  True when it ends."""
    orders = [schedule(kind, s, stages, micro) for s in range(stages)]
    pools = [SEND_BUFFERS if pool is None else pool for _ in orders]
    pos = [0] * stages
    sent = {}                   # (kind, k, from, to) -> received?
    history = {}                # (from, to) -> list of message keys in send order

    def needs(s):
        """The message stage ``s``'s next op waits for, if any."""
        if pos[s] == len(orders[s]):
            return None
        op, k = orders[s][pos[s]]
        if op == "W":
            return None
        if op == "F":
            return ("act", k, s - 1, s) if s > 0 else None
        return ("delta", k, s + 1, s) if s < stages - 1 else None

    def can_send(src, dst, msg):
        if pools[src] == 0:                                  # a blocking send: the receiver must be waiting
            return needs(dst) == msg
        done = history.get((src, dst), [])
        return len(done) < pools[src] or sent[done[-pools[src]]]

    progressed = True
    while progressed:
        progressed = False
        for s in range(stages):
            if pos[s] == len(orders[s]):
                continue
            op, k = orders[s][pos[s]]
            if op == "W":                                    # no message
                pos[s] += 1
                progressed = True
                continue
            if op == "F":
                need = ("act", k, s - 1, s) if s > 0 else None
                out = (s, s + 1) if s < stages - 1 else None
                msg = ("act", k, s, s + 1)
            else:
                need = ("delta", k, s + 1, s) if s < stages - 1 else None
                out = (s, s - 1) if s > 0 else None
                msg = ("delta", k, s, s - 1)
            if need is not None and need not in sent:
                continue
            if out is not None and not can_send(*out, msg):
                continue
            if need is not None:
                sent[need] = True
            if out is not None:
                sent[msg] = pools[s] == 0
                history.setdefault(out, []).append(msg)
            pos[s] += 1
            progressed = True
    return all(p == len(o) for p, o in zip(pos, orders))


def _unit_bubble(kind, stages, micro):
    """The idle share of the stages when each pass takes one unit of time (a whole backward pass two, B and W
    one each), each stage running its order and waiting for the message its next pass needs."""
    orders = [schedule(kind, s, stages, micro) for s in range(stages)]
    cost = {"F": 1, "B": 1 if kind == "zb1" else 2, "W": 1}
    done, free, pos = {}, [0] * stages, [0] * stages
    while any(p < len(o) for p, o in zip(pos, orders)):
        moved = False
        for s in range(stages):
            while pos[s] < len(orders[s]):
                op, k = orders[s][pos[s]]
                dep = {"F": ("F", s - 1, k) if s > 0 else None,
                       "B": ("B", s + 1, k) if s < stages - 1 else None, "W": None}[op]
                if dep is not None and dep not in done:
                    break
                free[s] = max(free[s], done.get(dep, 0)) + cost[op]
                done[(op, s, k)] = free[s]
                pos[s] += 1
                moved = True
        assert moved, "deadlock"
    return 1 - 3 * micro * stages / (stages * max(free))


def test_zb1_has_a_third_of_1f1bs_bubble_in_unit_time():
    """The textbook formulas: 1F1B idles 3 (P - 1) units of 3 (M + P - 1), ZB-H1 P - 1 of 3 M + P - 1."""
    for stages, micro in itertools.product(range(2, 7), range(1, 13)):
        ones = _unit_bubble("1f1b", stages, micro)
        assert ones == pytest.approx((stages - 1) / (micro + stages - 1))
        zb1 = _unit_bubble("zb1", stages, micro)
        assert zb1 <= ones + 1e-12
        if micro >= stages:
            assert zb1 == pytest.approx((stages - 1) / (3 * micro + stages - 1)), (stages, micro)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b", "zb1"])
def test_schedules_cannot_deadlock_with_the_send_pools_used(kind):
    for stages, micro in itertools.product(range(1, 7), range(1, 10)):
        assert _runs_to_the_end(kind, stages, micro), (kind, stages, micro)


def test_the_deadlock_check_can_fail():
    """Blocking sends deadlock 1F1B: two neighbours each send to the other and wait."""
    assert _runs_to_the_end("gpipe", 4, 8, 0)
    assert not _runs_to_the_end("1f1b", 4, 8, 0)
    assert _runs_to_the_end("1f1b", 4, 8, 1)          # one buffer per link is enough; the trainer has two
    assert not _runs_to_the_end("zb1", 4, 8, 0)


def _acts(sizes, loss="quadratic"):
    """The state activation codes of a sigmoid net of ``sizes`` with ``loss``."""
    return state_codes(("sigmoid",) * (len(sizes) - 2), loss)


def _stage(plan, first, last, *, l2, slots, loss="quadratic", acts=None, deferred=0):
    return Stage(plan, first_stage=first, last_stage=last, loss=loss, l2=l2, slots=slots, deferred=deferred,
                 acts=_acts(plan.sizes, loss) if acts is None else acts)


def _chain(sizes, cuts, strategy, micro_rows, dtype, loss="quadratic", l2=0.0):
    """A pipeline in one process: Stages over ``cuts`` (layers per stage) and their parameters."""
    np.random.seed(0)
    net = fastckpt.Network(sizes, dtype=dtype, loss=loss, l2=l2)
    stages, lo = [], 0
    for s, n in enumerate(cuts):
        sub = sizes[lo:lo + n + 1]
        params = fastckpt.Parameters(sub, dtype)
        for i in range(n):
            params.weights[i] = net.weights[lo + i]
            params.biases[i] = net.biases[lo + i]
        plan = fastckpt.plan(sub, micro_rows, dtype, strategy)
        stage = _stage(plan, s == 0, s == len(cuts) - 1, loss=loss, l2=net.l2[lo:lo + n], slots=4,
                       acts=_acts(sizes, loss)[lo:lo + n + 1])
        stages.append((stage, params))
        lo += n
    return net, stages


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_a_chain_of_stages_gives_the_gradients_of_one_net(strategy, dtype, rng):
    sizes = [13, 9, 8, 7, 11, 6, 5]
    batch, micro = 10, [0, 3, 7, 10]                        # micro-batches of 3, 4 and 3 rows
    x = rng.random((batch, sizes[0])).astype(dtype)
    y = rng.random((batch, sizes[-1])).astype(dtype)
    for cuts in ([6], [2, 4], [1, 3, 2], [3, 1, 1, 1]):
        net, stages = _chain(sizes, cuts, strategy, 4, dtype, loss="cross_entropy", l2=0.01)
        accs = [p.new_buffer() for _, p in stages]
        order = list(range(3))
        inputs = {}
        for k in order:                                      # every forward, GPipe-style
            a = x[micro[k]:micro[k + 1]]
            for s, (stage, params) in enumerate(stages):
                inputs[(s, k)] = a.copy()
                out = stage.forward(params, inputs[(s, k)], k)
                a = None if out is None else out.copy()
        losses = 0.0
        for j, k in enumerate(reversed(order)):
            rows = micro[k + 1] - micro[k]
            delta = None
            for s in reversed(range(len(stages))):
                stage, params = stages[s]
                if delta is not None:
                    stage.output_delta(rows)[...] = delta
                status, loss = stage.backward(params, inputs[(s, k)],
                                              y[micro[k]:micro[k + 1]] if s == len(stages) - 1 else None,
                                              k, accs[s], 1.0 / batch, add=j > 0, l2=j == 0)
                assert status == 0
                if s == len(stages) - 1:
                    losses += loss * rows / batch
                delta = None if s == 0 else stage.input_delta(rows).copy()
        gb, gw = net.backprop(x, y)
        lo = 0
        tol = 1e-12 if dtype == np.float64 else 2e-5
        for (_, params), acc in zip(stages, accs):
            w, b = fastckpt.core.layout.layer_views(acc, params.sizes)
            for i in range(len(w)):
                np.testing.assert_allclose(w[i], gw[lo + i], rtol=tol, atol=tol * 1e-2)
                np.testing.assert_allclose(b[i], gb[lo + i][:, 0], rtol=tol, atol=tol * 1e-2)
            lo += len(w)
        penalty = net._engine.penalty(net.weights)
        assert losses + penalty == pytest.approx(net.last_loss, rel=tol)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_only_the_live_set_survives_between_passes(strategy, rng):
    """Poison the whole arena between a micro-batch's forward and backward pass, restoring only
    what the stage keeps: the gradients must not change by a bit (the live set is enough)."""
    sizes = [7, 6, 9, 5, 8, 6, 4]
    x, y = rng.random((5, 7)), rng.random((5, 4))
    for first, last in ((True, True), (False, True), (False, False), (True, False)):
        results = []
        for poison in (False, True):
            plan = fastckpt.plan(sizes, 5, np.float64, strategy)
            stage = _stage(plan, first, last, l2=np.zeros(6), slots=1)
            params = fastckpt.Parameters(sizes)
            params.flat[...] = rng.standard_normal(params.flat.shape) if not results else results[0][2]
            stage.forward(params, x, 0)
            if poison:
                stage.forward(params, x * 0.5, 1)            # another micro-batch takes the arena: 0 is stored
                stage.engine.workspace.activations[...] = np.nan
                stage._owner = None                          # the arena now holds nothing of anyone
            if not last:
                stage.output_delta(5)[...] = np.linspace(-1, 1, 5 * sizes[-1]).reshape(5, -1)
            acc = params.new_buffer()
            status, _ = stage.backward(params, x, y if last else None, 0, acc, 0.2, add=False, l2=True)
            assert status == 0
            results.append((acc.copy(), None if first else stage.input_delta(5).copy(), params.flat.copy()))
        np.testing.assert_array_equal(results[0][0], results[1][0])
        if not first:
            np.testing.assert_array_equal(results[0][1], results[1][1])


def test_balance_is_the_best_contiguous_split(rng):
    for _ in range(200):
        n = int(rng.integers(1, 9))
        stages = int(rng.integers(1, n + 1))
        costs = list(rng.integers(1, 20, n).astype(float))
        limit = float(rng.integers(10, 60))

        def fits(p, lo, hi, costs=costs, limit=limit):
            return sum(costs[lo:hi]) <= limit or hi - lo == 1 and p % 2 == 0
        best = None
        for cut in itertools.combinations(range(1, n), stages - 1):
            bounds = (0,) + cut + (n,)
            if all(fits(p, a, b) for p, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))):
                worst = max(sum(costs[a:b]) for a, b in zip(bounds[:-1], bounds[1:]))
                best = worst if best is None else min(best, worst)
        if best is None:
            with pytest.raises(ValueError, match="fits the memory limit"):
                balance(costs, stages, fits)
            continue
        parts = balance(costs, stages, fits)
        assert len(parts) == stages and sum(parts) == n and min(parts) >= 1
        bounds = np.concatenate([[0], np.cumsum(parts)])
        assert max(sum(costs[a:b]) for a, b in zip(bounds[:-1], bounds[1:])) == best


def test_a_refused_bound_names_the_least_bound_that_some_split_keeps(rng):
    """The bytes a refusal names are the least over every split (a scan of all of them here), and that bound is
    taken; they used to be the balanced split's largest stage, above a split that fits with less."""
    from fastckpt.planner import InfeasiblePlan
    for _ in range(100):
        n = int(rng.integers(2, 8))
        stages = int(rng.integers(2, n + 1))
        least = {(p, lo, hi): int(rng.integers(100, 1000)) for p in range(stages) for lo in range(n)
                 for hi in range(lo + 1, n + 1)}            # each stage's least bytes: any numbers will do

        def stage_total(p, lo, hi, limit, least=least):
            if least[p, lo, hi] > limit:
                raise InfeasiblePlan("does not fit", least[p, lo, hi])
            return {"total": min(limit, least[p, lo, hi] + 50)}        # within the bound it takes more
        splits = [(0,) + cut + (n,) for cut in itertools.combinations(range(1, n), stages - 1)]
        scan = min(max(least[p, a, b] for p, (a, b) in enumerate(zip(c[:-1], c[1:]))) for c in splits)
        sizes = [4] * (n + 1)

        def choose(limit, sizes=sizes, stages=stages):
            return choose_partition(sizes, stages, None, limit, 8,
                                    lambda stage, first, end: stage_total(stage, first, end, limit))
        with pytest.raises(InfeasiblePlan) as refused:
            choose(scan - 1)
        assert refused.value.minimum_bytes == scan, (refused.value, scan)
        assert f"the least any split needs is {scan} bytes" in str(refused.value)
        parts = choose(scan)
        bounds = np.concatenate([[0], np.cumsum(parts)])
        assert max(least[p, a, b] for p, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))) <= scan


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_backward_pass_split_in_b_and_w_is_the_whole_one_bit_for_bit(strategy, rng):
    """zb1's B (the deltas, inputs and deltas stashed) and later W (the weight gradients from the stash), with
    another micro-batch's forward pass in between, give the whole backward pass's gradient and input delta."""
    sizes = [7, 6, 9, 5, 8, 6, 4]
    x, y = rng.random((5, 7)), rng.random((5, 4))
    plan = fastckpt.plan(sizes, 5, np.float64, strategy)
    params = fastckpt.Parameters(sizes)
    params.flat[...] = rng.standard_normal(params.flat.shape)
    for first, last in ((True, True), (False, True), (False, False), (True, False)):
        results = []
        for split in (False, True):
            stage = _stage(plan, first, last, l2=np.full(6, 0.01), slots=1, deferred=1)
            acc = params.new_buffer()
            for k, first_pass in ((0, True), (1, False)):        # W's copy, then its sum
                stage.forward(params, x * (k + 1), k)
                if not last:
                    stage.output_delta(5)[...] = np.linspace(-1, 1, 20).reshape(5, 4) * (k + 1)
                if split:
                    status, loss = stage.backward_input(params, x * (k + 1), y if last else None, k)
                    delta = None if first else stage.input_delta(5).copy()
                    stage.forward(params, x * 0.5, 9)               # another micro-batch takes the arena
                    stage._owner = None
                    stage.backward_weights(params, k, acc, 0.2, add=not first_pass, l2=first_pass)
                else:
                    status, loss = stage.backward(params, x * (k + 1), y if last else None, k, acc, 0.2,
                                                  add=not first_pass, l2=first_pass)
                    delta = None if first else stage.input_delta(5).copy()
                assert status == 0
                results.append((delta, loss))
            results.append((acc.copy(), None))
        whole, split = results[:3], results[3:]
        np.testing.assert_array_equal(whole[2][0], split[2][0])
        assert np.any(whole[2][0] != 0)
        for (d0, l0), (d1, l1) in zip(whole[:2], split[:2]):
            if not first:
                np.testing.assert_array_equal(d0, d1)
            assert (np.isnan(l0) and np.isnan(l1)) == (not last) and (not last or l0 == l1)
