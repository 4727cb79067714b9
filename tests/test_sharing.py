"""BLAS threads follow the cores other programs leave free (NOTE [ Threads on a shared machine ]): the rule,
the looks that apply it, the switches that turn it off, and plans that count the threads asked for."""
import json
import os
import re
import subprocess
import sys
import threading

import numpy as np
import pytest
from fastckpt.kernels import blas_threads, blas_threads_running

import fastckpt
from fastckpt.engine import sharing


@pytest.mark.parametrize("others, cores, ceiling, threads", [
    (0.0, 2, 2, 2), (0.3, 2, 2, 2), (0.5, 2, 2, 1), (1.0, 2, 2, 1), (2.0, 2, 2, 1), (7.0, 2, 2, 1),
    (0.0, 2, 1, 1), (0.0, 8, 4, 4), (3.0, 8, 8, 5), (2.7, 8, 8, 5), (2.6, 8, 8, 5), (2.4, 8, 8, 5),
    (3.4, 8, 8, 4)])
def test_the_rule_takes_the_cores_the_others_leave_and_never_more_than_asked(others, cores, ceiling, threads):
    # independent reading of the rule: a core is free while the others use at most MARGIN of it
    free = sum(1 for c in range(cores) if others - c <= sharing.MARGIN)
    assert threads == max(1, min(ceiling, free)) == sharing.threads_for(others, cores, ceiling)


class Machine:
    """A scripted machine: each look reads the next (seconds the others used) over one window."""

    def __init__(self, monkeypatch, others, ceiling=2, cores=2):
        self.others, self.wall, self.busy, self.mine = list(others), 0.0, 0.0, 0.0
        self.running, self.ceiling, self.set = ceiling, ceiling, []
        monkeypatch.setattr(sharing, "SHARING", sharing.Sharing())
        sharing.SHARING.cores = cores
        monkeypatch.setattr(sharing.SHARING, "sample", self.sample)
        monkeypatch.setattr(sharing, "blas_threads", lambda: self.ceiling)
        monkeypatch.setattr(sharing, "blas_threads_running", lambda: self.running)
        monkeypatch.setattr(sharing, "run_blas_threads", self.run)
        monkeypatch.setattr(sharing.time, "monotonic", lambda: self.wall)

    def sample(self):
        return self.wall, self.busy, self.mine

    def run(self, n):
        self.running = n
        self.set.append(n)

    def window(self):
        """One window of training passes; this process used its threads, the others what the script says."""
        self.wall += sharing.WINDOW
        self.mine += self.running * sharing.WINDOW
        self.busy += self.running * sharing.WINDOW + self.others.pop(0) * sharing.WINDOW
        sharing.tick()


def test_a_busy_machine_takes_threads_away_at_once_and_gives_them_back_after_two_looks(monkeypatch):
    m = Machine(monkeypatch, [0, 1.0, 0.1, 0.1, 0.1, 1.2, 0.0, 0.9, 0.0, 0.0])
    sharing.tick()                                      # the first look only starts the clock
    got = []
    for _ in range(10):
        m.window()
        got.append(m.running)
    assert got == [2, 1, 1, 2, 2, 1, 1, 1, 1, 2], got
    assert m.set == [1, 2, 1, 2]


def test_looks_come_once_a_window_and_a_stale_look_starts_afresh(monkeypatch):
    m = Machine(monkeypatch, [])
    sharing.tick()
    m.wall += sharing.WINDOW / 2
    m.busy += 2 * sharing.WINDOW                       # a burst the next look should not yet read
    sharing.tick()
    assert sharing.SHARING.last[0] == 0.0                # no look within the window
    m.wall += 10 * sharing.WINDOW                       # a long pause (no training): not an average over it
    sharing.tick()
    assert m.set == [] and sharing.SHARING.last[0] == m.wall


def test_nothing_changes_when_fixed_on_one_thread_asked_or_off_the_main_thread(monkeypatch):
    m = Machine(monkeypatch, [2.0] * 3)
    sharing.SHARING.auto = False
    sharing.tick()
    m.window()
    assert m.set == []
    sharing.SHARING.auto = True
    m.ceiling = m.running = 1
    m.window()
    assert m.set == []
    m.ceiling = m.running = 2
    sharing.tick()
    worker = threading.Thread(target=m.window)
    worker.start()
    worker.join()
    assert m.set == []                                   # DataParallel's workers never change the count


def test_fix_threads_refuses_what_is_not_a_count():
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=f"BLAS threads must be a whole number >= 1, got {bad!r}"):
            sharing.fix_threads(bad)


PROBE = """
import json, os, sys, time, warnings
warnings.simplefilter("always")
import numpy as np
from fastckpt import Network
from fastckpt.engine import sharing
from fastckpt.kernels import blas_threads, blas_threads_running
np.random.seed(0)
net = Network([784, 256, 256, 10])
x, y = np.random.rand(128, 784), np.eye(10)[np.arange(128) % 10]
seen = set()
end, until = time.monotonic() + float(sys.argv[1]), int(sys.argv[2])      # until that many threads run (0: the end)
while time.monotonic() < end and until not in seen:
    net.update_mini_batch(x, y, 0.01)
    seen.add(blas_threads_running())
print(json.dumps({"ceiling": blas_threads(), "running": blas_threads_running(), "seen": sorted(seen),
                  "auto": sharing.SHARING.auto, "plan": net.plan(128).blas_threads}))
"""


def _probe(seconds, until=0, **env):
    """Train in a process of its own for ``seconds`` (or until BLAS runs ``until`` threads); what it saw."""
    proc = subprocess.run([sys.executable, "-c", PROBE, str(seconds), str(until)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, **env))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


@pytest.mark.skipif(blas_threads() < 2 or len(os.sched_getaffinity(0)) < 2, reason="BLAS has one thread here")
def test_with_every_core_held_by_other_programs_blas_drops_to_one_thread_and_plans_keep_the_count_asked():
    cores = len(os.sched_getaffinity(0))
    hogs = [subprocess.Popen([sys.executable, "-c", "import time\nend = time.monotonic() + 60\n"
                              "while time.monotonic() < end: pass"]) for _ in range(cores)]
    try:
        got, _ = _probe(60.0, until=1, FASTCKPT_BLAS_THREADS="auto")     # a loaded machine takes its time
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert got["auto"] and got["running"] == 1 and 1 in got["seen"], got
    assert got["plan"] == got["ceiling"] >= 2, got         # the plan counts the threads BLAS may come back to


@pytest.mark.parametrize("value, ceiling, auto, warned", [("1", 1, False, False), ("auto", None, True, False),
                                                          ("two", None, True, True), ("0", None, True, True)])
def test_the_environment_variable_fixes_the_count_or_says_why_not(value, ceiling, auto, warned):
    got, err = _probe(0.2, FASTCKPT_BLAS_THREADS=value)
    assert got["auto"] is auto and (ceiling is None or got["ceiling"] == got["running"] == ceiling), got
    said = f"FASTCKPT_BLAS_THREADS must be 'auto' or a whole number >= 1, got '{value}'; using auto"
    assert (said in err) is warned, err


def test_a_memray_measurement_holds_blas_at_the_planned_threads(monkeypatch):
    from fastckpt.report.measure import memray_peak
    ceiling = blas_threads()
    seen = []
    monkeypatch.setattr(sharing.SHARING, "auto", True)
    memray_peak(lambda: seen.append((sharing.SHARING.auto, blas_threads_running())))
    assert seen == [(False, ceiling)] and sharing.SHARING.auto


def test_plan_blas_threads_on_the_command_line_is_the_plan_of_that_many():
    proc = subprocess.run([sys.executable, "-m", "fastckpt", "plan", "--sizes", "784,512,512,10", "--batch-size",
                           "256", "--strategy", "plain", "--blas-threads", "1", "--json"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    one = fastckpt.plan([784, 512, 512, 10], 256, strategy="plain", blas_threads=1).bytes()
    assert got["bytes"]["blas"] == one["blas"] and got["bytes"]["total"] == one["total"], got["bytes"]


def test_a_count_that_is_not_one_is_refused_naming_the_flag():
    proc = subprocess.run([sys.executable, "-m", "fastckpt", "train", "--blas-threads", "0"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and "argument --blas-threads: must be auto or a whole number >= 1, got '0'" in \
        proc.stderr, proc.stderr


def test_more_threads_than_the_library_runs_are_refused_and_change_nothing():
    """OpenBLAS runs at most the threads it was built for and quietly runs that many instead: plans would count
    buffers for threads that never run."""
    before, auto = blas_threads(), sharing.SHARING.auto
    with pytest.raises(ValueError, match=r"BLAS threads must be at most \d+, the most the BLAS library runs, "
                                         r"got 99999") as info:
        sharing.fix_threads(99999)
    assert blas_threads() == before and sharing.SHARING.auto == auto
    most = int(re.search(r"at most (\d+)", str(info.value)).group(1))
    for n in (2**32, 2**32 + most, 2**64):                # past a C int: named as they are, not wrapped around
        with pytest.raises(ValueError, match=f"at most {most}, the most the BLAS library runs, got {n}$"):
            sharing.fix_threads(n)
    sharing.fix_threads(np.int64(1))                      # numpy's integers are counts too
    assert blas_threads() == 1
    if auto:
        sharing.fix_threads(None)
    else:
        sharing.fix_threads(before)
    proc = subprocess.run([sys.executable, "-m", "fastckpt", "plan", "--blas-threads", "99999"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0 and "--blas-threads: BLAS threads must be at most" in proc.stderr, proc.stderr
    env = dict(os.environ, FASTCKPT_BLAS_THREADS="99999")
    proc = subprocess.run([sys.executable, "-c", "import fastckpt"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0 and "FASTCKPT_BLAS_THREADS: BLAS threads must be at most" in proc.stderr, proc.stderr
