"""The lab's training loop: same accuracies as the lab code, MNIST accuracy, no allocation per step."""
import os

import lab_numpy
import numpy as np
import pytest

from fastckpt import Network, NetworkWithCheckpointing


def _lab_run(module, cls_name, mnist, epochs, batch, **kw):
    (x_train, y_train), (x_test, y_test) = mnist
    np.random.seed(2022)
    net = getattr(module, cls_name)([784, 40, 30, 10], **kw)
    mem, times = net.SGD((x_train, y_train), epochs=epochs, mini_batch_size=batch, eta=3.,
                         test_data=(x_test, y_test))
    return net, mem, times


def _accuracies(out):
    return [float(line.split("Accuracy: ")[1]) for line in out.splitlines() if "Accuracy" in line]


@pytest.mark.parametrize("cls_name,kw", [("Network", {}),
                                         ("NetworkWithCheckpointing", {"checkpoint_every_nth_layer": 2})])
def test_notebook_cells_give_the_labs_accuracies(mnist, capsys, cls_name, kw):
    import fastckpt
    epochs = 10
    _, mem, times = _lab_run(lab_numpy, cls_name, mnist, epochs, 100, **kw)
    lab_acc = _accuracies(capsys.readouterr().out)
    _, mem2, times2 = _lab_run(fastckpt, cls_name, mnist, epochs, 100, **kw)
    ours = _accuracies(capsys.readouterr().out)
    assert len(lab_acc) == len(ours) == epochs
    # same seed, same algorithm: at most one of the 1,000 test digits may flip through rounding
    np.testing.assert_allclose(ours, lab_acc, atol=1e-3 + 1e-12)
    assert len(mem2) == len(times2) == len(mem) == epochs * 40
    assert all(m > 0 for m in mem2) and all(t > 0 for t in times2)


def test_lab_net_reaches_85_percent_with_batch_10(mnist, capsys):
    (x_train, y_train), (x_test, y_test) = mnist
    net = Network([784, 40, 30, 10])
    net.SGD((x_train, y_train), epochs=10, mini_batch_size=10, eta=3.0, test_data=(x_test, y_test))
    assert max(net.accuracies) >= 0.85, net.accuracies
    assert net.evaluate(x_test, y_test) == net.accuracies[-1]
    assert net.evaluate(x_test, y_test.argmax(axis=1)) == net.accuracies[-1]


def test_sgd_warns_about_skipped_samples_and_can_use_them(rng, capsys):
    x, y = rng.random((25, 4)), rng.random((25, 2))
    net = Network([4, 3, 2])
    with pytest.warns(UserWarning, match="last 5 of 25"):
        mem, _ = net.SGD((x, y), epochs=1, mini_batch_size=10, eta=0.1)
    assert len(mem) == 2
    mem, _ = net.SGD((x, y), epochs=1, mini_batch_size=10, eta=0.1, drop_last=False)
    assert len(mem) == 3


def test_divergence_stops_with_epoch_and_update_and_keeps_finite_weights(rng, capsys):
    x, y = np.full((40, 4), 1e300), rng.random((40, 2))
    net = Network([4, 3, 2])
    net.weights[0][...] = 1e-300                     # unsaturated, but grad_w ~ 1e299 and eta * grad_w overflows
    before = [w.copy() for w in net.weights + net.biases]
    with pytest.raises(FloatingPointError, match=r"epoch 1/2, update 1/4: the update would make a parameter NaN"):
        net.SGD((x, y), epochs=2, mini_batch_size=10, eta=1e15)
    for a, b in zip(before, net.weights + net.biases):
        np.testing.assert_array_equal(a, b)
        assert np.all(np.isfinite(a))


def test_nan_written_into_the_weights_stops_training(rng, capsys):
    x, y = rng.random((20, 4)), rng.random((20, 2))
    net = Network([4, 3, 2])
    net.SGD((x, y), epochs=1, mini_batch_size=10, eta=0.1)
    net.weights[1][0, 0] = np.nan                    # in place: no assignment to check
    with pytest.raises(FloatingPointError, match=r"epoch 1/1, update 1/2: the loss is nan"):
        net.SGD((x, y), epochs=1, mini_batch_size=10, eta=0.1)


@pytest.mark.parametrize("cls", [Network, NetworkWithCheckpointing])
def test_steps_after_the_first_allocate_no_arrays(tmp_path, mnist, cls):
    memray = pytest.importorskip("memray")
    (x_train, y_train), _ = mnist
    net = cls([784, 40, 30, 10])
    net.update_mini_batch(x_train[:100], y_train[:100], 0.1)
    path = os.fspath(tmp_path / "steps.bin")
    with memray.Tracker(path, native_traces=True):
        for i in range(1, 6):
            net.update_mini_batch(x_train[100 * i:100 * i + 100], y_train[100 * i:100 * i + 100], 0.1)
    arrays, records = [], 0
    for rec in memray.FileReader(path).get_allocation_records():
        if rec.allocator == memray.AllocatorType.FREE:
            continue
        records += 1
        frames = [frame[0] for frame in rec.native_stack_trace()]
        numpy_array = any("PyDataMem" in f for f in frames)
        numba_array = rec.size >= 256 and any(f.startswith("NRT_MemInfo_alloc") for f in frames)
        if numpy_array or numba_array:
            arrays.append((rec.size, list(rec.stack_trace())[:3]))
    # numpy serves arrays under 1 KiB from a cache without malloc; every (batch, width) buffer is larger
    assert records > 0                                # the tracker saw the steps
    assert arrays == []


def test_the_rss_recorded_before_each_update_is_psutils_and_a_forked_child_reads_its_own():
    import psutil

    from fastckpt.core.resources import ResidentBytes

    with ResidentBytes() as rss:
        before = rss()
        assert abs(before - psutil.Process().memory_info().rss) <= 256 * 1024
        block = np.ones(10 * 2**20)                                    # 80 MiB, touched
        grown = rss()
        assert grown - before >= 75 * 2**20
        assert abs(grown - psutil.Process().memory_info().rss) <= 256 * 1024
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:                                                   # the child: the parent's descriptor
            del block                                                  # is not read for the child's RSS
            os.write(write, str(rss() - psutil.Process().memory_info().rss).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        assert abs(int(os.read(read, 64))) <= 256 * 1024
        del block
    assert abs(rss() - psutil.Process().memory_info().rss) <= 256 * 1024   # closed: through psutil


def test_sgd_records_the_processs_rss_before_each_update():
    import psutil

    net = Network([20, 8, 4])
    rng = np.random.default_rng(0)
    x, y = rng.random((60, 20)), rng.random((60, 4))
    mem, times = net.SGD((x, y), epochs=2, mini_batch_size=10, eta=0.5, verbose=False)
    assert len(mem) == len(times) == 12
    now = psutil.Process().memory_info().rss
    assert all(0 < m <= now + 2**20 for m in mem) and min(mem) >= now - 64 * 2**20


def test_a_resident_bytes_reader_is_not_copied():
    import copy
    import pickle

    from fastckpt.core.resources import ResidentBytes

    with ResidentBytes() as rss:
        for clone in (copy.copy, copy.deepcopy, lambda r: pickle.loads(pickle.dumps(r))):
            with pytest.raises(TypeError, match="cannot be copied"):
                clone(rss)
