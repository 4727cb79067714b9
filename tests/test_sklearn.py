"""fastckpt.sklearn: scikit-learn's own estimator checks, its MLPs as the reference for the same settings, pipelines
in GridSearchCV and cross_val_score, the data users hold, and max_memory as a bound on the whole fit."""
import pickle
import warnings

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn")
from sklearn import neural_network  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402

from fastckpt.sklearn import MLPClassifier, MLPRegressor  # noqa: E402

MiB = 2**20


@parametrize_with_checks([MLPClassifier(), MLPRegressor()])
def test_scikit_learns_estimator_checks(estimator, check):
    """Every check scikit-learn's own MLPs pass but those on what these do not take, which scikit-learn leaves out
    by itself: the tags declare no sparse input (so the sparse checks expect a refusal) and no multi-label
    classification, and fit has no sample_weight (its array-API check skips itself unless SCIPY_ARRAY_API is
    set)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        check(estimator)


def _regression(rng, n=300, n_in=5, n_out=1):
    x = rng.standard_normal((n, n_in))
    y = np.sin(x[:, :n_out] * 2) + x[:, 1:n_out + 1] ** 2
    return x, y.ravel() if n_out == 1 else y


def _fit_both(ours, theirs, x, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return ours.fit(x, y), theirs.fit(x, y)


@pytest.mark.parametrize("solver, tol", [("sgd", 1e-12), ("adam", 1e-4)])
def test_a_regressor_trains_as_scikit_learns_from_the_same_draw(rng, solver, tol):
    """The same random_state draws the same initial weights; minibatches in order and SGD with Nesterov's
    momentum make the same updates: scikit-learn's coefs_ to rounding.  Adam adds epsilon to sqrt(v) after its
    bias correction (PyTorch's form), scikit-learn before it: weights whose gradient is near 0 move a little
    differently, 6e-5 after these 4 epochs."""
    x, y = _regression(rng)
    common = dict(hidden_layer_sizes=(16, 8), activation="tanh", solver=solver, alpha=1e-3, batch_size=50,
                  learning_rate_init=0.01, shuffle=False, random_state=3, max_iter=4, momentum=0.5)
    ours, theirs = _fit_both(MLPRegressor(**common), neural_network.MLPRegressor(**common), x, y)
    for a, b in zip(ours.coefs_ + ours.intercepts_, theirs.coefs_ + theirs.intercepts_):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
    np.testing.assert_allclose(ours.loss_curve_, theirs.loss_curve_, rtol=tol / 100)
    assert (ours.n_iter_, ours.t_) == (theirs.n_iter_, theirs.t_) == (4, 4 * 300)
    np.testing.assert_allclose(ours.predict(x), theirs.predict(x), rtol=tol, atol=tol)


def test_the_last_smaller_minibatch_keeps_the_batch_s_l2(rng):
    """scikit-learn scales alpha by each minibatch's size; the engine's l2 is alpha / batch_size for all of an
    epoch's, so with a smaller last minibatch and alpha > 0 the weights differ by about lr * alpha per epoch."""
    x, y = _regression(rng)
    common = dict(hidden_layer_sizes=(8,), solver="sgd", momentum=0.0, batch_size=32, learning_rate_init=0.01,
                  shuffle=False, random_state=3, max_iter=2)
    for alpha, tol in ((0.0, 1e-12), (1e-3, 1e-5)):
        ours, theirs = _fit_both(MLPRegressor(alpha=alpha, **common), neural_network.MLPRegressor(
            alpha=alpha, **common), x, y)
        gap = max(np.abs(a - b).max() for a, b in zip(ours.coefs_, theirs.coefs_))
        assert gap < tol and (alpha == 0 or gap > 1e-9), (alpha, gap)


def test_multi_output_regression_and_invscaling_as_scikit_learns(rng):
    """Three outputs: the same weights as scikit-learn's, whose reported loss is ours over the outputs."""
    x, y = _regression(rng, n_out=3)
    common = dict(hidden_layer_sizes=(12,), activation="relu", solver="sgd", momentum=0.0, alpha=0.0,
                  learning_rate="invscaling", power_t=0.25, learning_rate_init=0.05, batch_size=50,
                  shuffle=False, random_state=0, max_iter=3)
    ours, theirs = _fit_both(MLPRegressor(**common), neural_network.MLPRegressor(**common), x, y)
    for a, b in zip(ours.coefs_ + ours.intercepts_, theirs.coefs_ + theirs.intercepts_):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(np.array(ours.loss_curve_) / 3, theirs.loss_curve_, rtol=1e-9)
    assert ours.predict(x).shape == (300, 3) and ours.n_outputs_ == 3


def test_a_multiclass_classifier_trains_as_scikit_learns(rng):
    """Three classes or more: the same softmax output and log-loss, so the same weights; the training loss,
    without scikit-learn's clipping of probabilities, stops at the same epoch."""
    x = rng.standard_normal((240, 4))
    y = np.array(["cat", "dog", "emu"])[(x[:, 0] > 0).astype(int) + (x[:, 1] > 0.5)]
    common = dict(hidden_layer_sizes=(10,), activation="logistic", solver="sgd", batch_size=40, shuffle=False,
                  random_state=1, max_iter=200, n_iter_no_change=3, tol=1e-3, learning_rate_init=0.2)
    ours, theirs = _fit_both(MLPClassifier(**common), neural_network.MLPClassifier(**common), x, y)
    assert list(ours.classes_) == list(theirs.classes_) == ["cat", "dog", "emu"]
    for a, b in zip(ours.coefs_ + ours.intercepts_, theirs.coefs_ + theirs.intercepts_):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    assert ours.n_iter_ == theirs.n_iter_ < 200 and ours.best_loss_ == pytest.approx(theirs.best_loss_, rel=1e-9)
    np.testing.assert_allclose(ours.predict_proba(x), theirs.predict_proba(x), rtol=1e-9, atol=1e-12)
    assert (ours.predict(x) == theirs.predict(x)).all()


def test_early_stopping_restores_the_best_validation_epoch(rng):
    x = rng.standard_normal((400, 6))
    y = (x[:, 0] + 0.8 * rng.standard_normal(400) > 0).astype(int)
    clf = MLPClassifier((32,), early_stopping=True, n_iter_no_change=3, max_iter=200, learning_rate_init=0.05,
                        random_state=0, validation_fraction=0.25).fit(x, y)
    scores = clf.validation_scores_
    assert clf.n_iter_ == len(scores) < 200 and clf.best_validation_score_ == max(scores)
    assert clf.best_loss_ is None and clf.net_.history["val_accuracy"] == scores
    best = int(np.argmax(scores))
    assert clf.n_iter_ - 1 - best > 3 or max(scores[best + 1:]) < max(scores) + clf.tol
    stop = clf.net_.history                                   # the weights are the best epoch's: their score
    val = clf.net_.held_out_scores(*_validation_of(clf, x, y))
    assert val[1] == clf.best_validation_score_ and len(stop["loss"]) == clf.n_iter_


def _validation_of(clf, x, y):
    """The validation split the fit drew (the same random_state draws it again after the same weights)."""
    from sklearn.utils import check_random_state

    from fastckpt.sklearn.data import split
    rng = check_random_state(clf.random_state)
    for fan_in, fan_out in zip(clf.net_.sizes[:-1], clf.net_.sizes[1:]):
        rng.uniform(size=(fan_in, fan_out))
        rng.uniform(size=fan_out)
    return split(x, np.searchsorted(clf.classes_, y), clf.validation_fraction, rng, labels=np.searchsorted(
        clf.classes_, y))[1]


def test_the_validation_split_is_stratified(rng):
    from fastckpt.sklearn.data import split
    labels = np.repeat([0, 1, 2], [600, 300, 100])
    x = np.arange(1000.0).reshape(-1, 1)
    (xt, yt), (xv, yv) = split(x, labels, 0.1, np.random.RandomState(0), labels=labels)
    assert np.bincount(yv).tolist() == [60, 30, 10] and len(yt) == 900
    assert sorted(np.concatenate([xt, xv]).ravel().tolist()) == x.ravel().tolist()


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.sweep("1")
def test_pipelines_in_grid_search_and_cross_val_score(rng, jobs):
    """``make_pipeline(StandardScaler(), MLPClassifier())`` cross-validated and grid-searched, in this process
    and in scikit-learn's worker processes (``n_jobs=2``: the slow run, as their start imports fastckpt)."""
    from sklearn.model_selection import GridSearchCV, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    x = rng.standard_normal((150, 4)) * [1, 10, 100, 0.1] + 5
    y = (x[:, 0] - 5 + (x[:, 1] - 5) / 10 > 0).astype(int)
    pipe = make_pipeline(StandardScaler(), MLPClassifier((8,), max_iter=40, random_state=0,
                                                         learning_rate_init=0.05))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        scores = cross_val_score(pipe, x, y, cv=3, n_jobs=jobs)
        assert scores.shape == (3,) and scores.min() > 0.8, scores
        search = GridSearchCV(pipe, {"mlpclassifier__alpha": [1e-4, 1e-1],
                                     "mlpclassifier__strategy": ["plain", "sqrt"]}, cv=3, n_jobs=jobs).fit(x, y)
    assert search.best_score_ > 0.8 and len(search.cv_results_["params"]) == 4
    by_strategy = search.cv_results_["mean_test_score"].reshape(2, 2)
    np.testing.assert_array_equal(by_strategy[:, 0], by_strategy[:, 1])       # sqrt trains plain's bits
    assert search.predict(x).shape == (150,) and search.best_estimator_[-1].n_features_in_ == 4


def test_dataframes_string_labels_and_pickles(rng):
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame(rng.standard_normal((120, 3)), columns=["a", "b", "c"])
    labels = np.where(frame["a"] > 0, "yes", "no")
    clf = MLPClassifier((6,), max_iter=30, random_state=0, learning_rate_init=0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(frame, labels)
    assert list(clf.feature_names_in_) == ["a", "b", "c"] and clf.n_features_in_ == 3
    assert set(clf.predict(frame)) <= {"yes", "no"} and clf.predict_proba(frame).shape == (120, 2)
    again = pickle.loads(pickle.dumps(clf))
    np.testing.assert_array_equal(again.predict_proba(frame), clf.predict_proba(frame))
    again.coefs_[0][...] = 0                                       # views of the unpickled net's own weights
    assert not again.net_.weights[0].any() and clf.net_.weights[0].any()
    np.testing.assert_allclose(np.exp(clf.predict_log_proba(frame)), clf.predict_proba(frame))


def test_partial_fit_and_warm_start_go_on(rng):
    x, y = _regression(rng)
    reg = MLPRegressor(hidden_layer_sizes=(8,), random_state=0, learning_rate_init=0.01)
    for k in range(3):
        reg.partial_fit(x, y)
        assert reg.n_iter_ == 1 and reg.t_ == 300 * (k + 1) and len(reg.loss_curve_) == k + 1
    clf = MLPClassifier((5,), random_state=0)
    with pytest.raises(ValueError, match="classes must be passed on the first call to partial_fit"):
        clf.partial_fit(x, y > 0)
    clf.partial_fit(x[:50], y[:50] > 0, classes=[False, True])
    with pytest.raises(ValueError, match=r"y holds labels not in classes_"):
        clf.partial_fit(x, np.where(y > 0, 2, 1))
    warm = MLPRegressor(hidden_layer_sizes=(8,), random_state=0, max_iter=2, warm_start=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        warm.fit(x, y)
        first = [w.copy() for w in warm.coefs_]
        warm.fit(x, y)
    assert len(warm.loss_curve_) == 4 and warm.t_ == 4 * 300 and warm.n_iter_ == 2
    assert not np.array_equal(first[0], warm.coefs_[0])


@pytest.mark.parametrize("change", [{"strategy": "sqrt"}, {"optimizer_in_backward": True},
                                    {"strategy": "revolve(1)", "optimizer_in_backward": True}])
@pytest.mark.parametrize("solver", ["adam", "sgd"])
def test_partial_fit_after_a_new_strategy_goes_on_with_the_optimizer(rng, change, solver):
    """A strategy or the optimizer in backward changed between partial fits builds the net anew, but the
    optimizer goes on: Adam's moments and step count, momentum's velocity, bit for bit the partial fits of an
    estimator whose settings did not change (strategies change no number)."""
    x, y = _regression(rng)
    common = dict(hidden_layer_sizes=(8, 6), random_state=0, solver=solver, learning_rate_init=0.01)
    changed, same = MLPRegressor(**common), MLPRegressor(**common)
    for model in (changed, same):
        model.partial_fit(x, y)
    changed.set_params(**change)
    for model in (changed, same):
        model.partial_fit(x, y)
        model.partial_fit(x, y)
    assert changed.net_.optimizer_state.steps == same.net_.optimizer_state.steps
    for a, b in zip(changed.coefs_ + changed.intercepts_, same.coefs_ + same.intercepts_):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(changed.loss_curve_, same.loss_curve_)


def test_an_update_that_overflows_names_the_settings_that_sized_it(rng):
    """A huge alpha overflows the first update: the error names alpha and learning_rate_init with their values
    (it named only learning_rate_init)."""
    x, y = _regression(rng, n=50)
    reg = MLPRegressor(hidden_layer_sizes=(4,), alpha=1e300, max_iter=2, random_state=0)
    with pytest.raises(ValueError, match=r"learning_rate_init \(got 0\.001\) or alpha \(got 1e\+300\)"):
        reg.fit(x, y)


def test_a_warm_fit_with_early_stopping_that_never_beats_the_best_keeps_the_best_weights():
    """A warm fit whose epochs do not beat the best validation score carried over from the fit before ends with
    that fit's best weights, as scikit-learn's keeps its best coefficients (every weight came back zero: the
    buffer of the best weights was restored though this fit never filled it).  The first fit's best is an
    accuracy of 1, which no epoch can beat."""
    from sklearn.datasets import make_classification
    x, y = make_classification(400, 6, n_informative=4, n_classes=3, class_sep=4.0, flip_y=0, random_state=0)
    model = MLPClassifier(hidden_layer_sizes=(16,), early_stopping=True, warm_start=True, max_iter=30,
                          learning_rate_init=0.01, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(x, y)
        assert model.best_validation_score_ == 1.0
        best = [a.copy() for a in model.coefs_ + model.intercepts_]
        model.set_params(max_iter=3).fit(x, y)
    assert model.best_validation_score_ == 1.0
    for got, want in zip(model.coefs_ + model.intercepts_, best):
        np.testing.assert_array_equal(got, want)


def test_a_warm_fit_with_an_adaptive_rate_starts_again_at_learning_rate_init():
    """learning_rate="adaptive": a warm fit makes a new optimizer at learning_rate_init, as scikit-learn's does
    (the rate shrunk by the fit before was kept, and the warm fit stopped after one epoch)."""
    from sklearn.datasets import make_classification
    x, y = make_classification(300, 8, n_informative=5, n_classes=3, random_state=0)
    settings = dict(hidden_layer_sizes=(16,), solver="sgd", momentum=0, shuffle=False, learning_rate="adaptive",
                    learning_rate_init=0.5, tol=1e-2, n_iter_no_change=2, max_iter=40, warm_start=True,
                    random_state=0)
    ours, theirs = MLPClassifier(**settings), neural_network.MLPClassifier(**settings)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for model in (ours, theirs):
            model.fit(x, y).fit(x, y)
    assert ours.n_iter_ == theirs.n_iter_ > 1
    assert ours.loss_ == pytest.approx(theirs.loss_, rel=1e-4)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_long_double_data_trains_as_its_float64_values(rng):
    """np.longdouble X or y (as scikit-learn's MLPs take it) trains as the same values in float64: the finite
    check ran its float64 kernel on them and Numba failed to compile it."""
    x, y = _regression(rng, n=80)
    want = MLPRegressor(hidden_layer_sizes=(6,), max_iter=2, random_state=0).fit(x, y)
    for xs, ys in ((x.astype(np.longdouble), y), (x, y.astype(np.longdouble))):
        got = MLPRegressor(hidden_layer_sizes=(6,), max_iter=2, random_state=0).fit(xs, ys)
        for a, b in zip(got.coefs_ + got.intercepts_, want.coefs_ + want.intercepts_):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(got.predict(xs), want.predict(x))
    early = dict(hidden_layer_sizes=(6,), max_iter=2, random_state=0, early_stopping=True)
    got = MLPRegressor(**early).fit(x, y.astype(np.longdouble))      # the validation pass's kernel too
    want = MLPRegressor(**early).fit(x, y)
    for a, b in zip(got.coefs_ + got.intercepts_, want.coefs_ + want.intercepts_):
        np.testing.assert_array_equal(a, b)
    bad = x.astype(np.longdouble)
    bad[3, 1] = np.inf
    with pytest.raises(ValueError, match="X"):
        MLPRegressor(hidden_layer_sizes=(6,), max_iter=2).fit(bad, y)
    bad[3, 1] = np.longdouble(10) ** 4000
    with pytest.raises(ValueError, match=r"X holds 1e\+4000 at index \(3, 1\), past the range of the net's float64 "
                                         r".*; scale the data; nothing was trained"):
        MLPRegressor(hidden_layer_sizes=(6,), max_iter=2).fit(bad, y)


def test_a_momentum_of_one_trains_as_scikit_learns(rng):
    """momentum=1 (no decay of the velocity) is in scikit-learn's range [0, 1]; it was refused."""
    x, y = _regression(rng)
    common = dict(hidden_layer_sizes=(8,), solver="sgd", momentum=1.0, batch_size=50, shuffle=False,
                  random_state=0, max_iter=2, learning_rate_init=1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours, theirs = MLPRegressor(**common).fit(x, y), neural_network.MLPRegressor(**common).fit(x, y)
    for a, b in zip(ours.coefs_ + ours.intercepts_, theirs.coefs_ + theirs.intercepts_):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_prediction_errors_name_x_and_what_is_wrong(rng):
    """A value past a float32 net's range is named as X's, not as NaN or inf of an argument 'a'; weights set to inf
    through the writable coefs_ are named as the net's, not blamed on X; coefs_ and intercepts_ of the wrong shape
    are refused in scikit-learn's layout (the net's transposed one was named)."""
    x, y = _regression(rng, n=60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        reg = MLPRegressor(hidden_layer_sizes=(4,), max_iter=2, random_state=0, dtype=np.float32).fit(x, y)
    big = x[:3].copy()
    big[1, 2] = 1e39
    with pytest.raises(ValueError, match=r"X holds 1e\+39 at index \(1, 2\), past the range of the net's float32"):
        reg.predict(big)
    reg.coefs_[0][0, 0] = np.inf
    with pytest.raises(ValueError, match="the net's parameters hold NaN or inf"):
        reg.predict(x)
    with pytest.raises(ValueError, match=r"coefs_\[0\] must have shape \(5, 4\), got \(4, 5\)"):
        reg.coefs_ = [c.T for c in reg.coefs_]
    with pytest.raises(ValueError, match=r"intercepts_ must hold 2 arrays, one per layer, got 1"):
        reg.intercepts_ = reg.intercepts_[:1]


def test_partial_fit_in_a_new_dtype_goes_on_with_the_optimizer_in_its_layout(rng):
    """partial_fit after set_params(dtype=float32) carries Adam's moments into the float32 layout, whose blocks
    are aligned otherwise (16 floats, not 8): the next fits are the float64 ones to float32's rounding, where a
    new optimizer's first steps are ~learning_rate_init apart."""
    x, y = _regression(rng)
    common = dict(hidden_layer_sizes=(9, 7), random_state=0, learning_rate_init=1e-3)
    single, double = MLPRegressor(**common), MLPRegressor(**common)
    for model in (single, double):
        model.partial_fit(x, y)
    single.set_params(dtype=np.float32)
    for model in (single, double):
        model.partial_fit(x, y)
    assert single.coefs_[0].dtype == np.float32
    assert single.net_.optimizer_state.steps == double.net_.optimizer_state.steps == 4
    for a, b in zip(single.coefs_ + single.intercepts_, double.coefs_ + double.intercepts_):
        np.testing.assert_allclose(a, b, rtol=0, atol=2e-5)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_a_second_fit_of_one_estimator_in_another_thread_is_refused(rng):
    """Two threads fitting one estimator mixed their state (t_ twice one fit's, ten losses for five epochs); the
    second is refused while the first runs, which ends as a fit alone does."""
    import threading
    import time

    from fastckpt.sklearn import base
    x, y = rng.standard_normal((20000, 20)), rng.integers(0, 3, 20000)
    clf = MLPClassifier(hidden_layer_sizes=(64,), max_iter=5, tol=0, n_iter_no_change=100, random_state=0)
    first = threading.Thread(target=lambda: clf.fit(x, y))
    first.start()
    deadline = time.monotonic() + 60
    while clf not in base._FITTING and first.is_alive() and time.monotonic() < deadline:
        time.sleep(0.001)
    try:
        with pytest.raises(RuntimeError, match="this MLPClassifier is being fitted in another thread"):
            clf.fit(x, y)
    finally:
        first.join()
    assert clf.t_ == 5 * 20000 and len(clf.loss_curve_) == 5
    clf.fit(x[:100], y[:100])                                         # and fits again once it is done


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_warm_fits_with_invscaling_and_partial_fits_with_an_adaptive_rate_as_scikit_learns(rng):
    """A warm fit under invscaling starts a new optimizer, its first epoch at learning_rate_init (the rate
    went on decaying: weights 2.5e-2 apart after the second fit); partial_fit with learning_rate="adaptive"
    divides the rate by 5 where scikit-learn's does (it never changed)."""
    x, y = _regression(rng)
    common = dict(hidden_layer_sizes=(7,), solver="sgd", shuffle=False, random_state=0, alpha=0.0, momentum=0.0,
                  batch_size=50)
    warm = dict(common, learning_rate="invscaling", learning_rate_init=0.05, max_iter=2, warm_start=True)
    partial = dict(common, learning_rate="adaptive", learning_rate_init=0.01, tol=0.5, n_iter_no_change=2)
    for settings, calls in ((warm, ("fit",) * 3), (partial, ("partial_fit",) * 12)):
        ours, theirs = MLPRegressor(**settings), neural_network.MLPRegressor(**settings)
        for model in (ours, theirs):
            for call in calls:
                getattr(model, call)(x, y)
        for a, b in zip(ours.coefs_ + ours.intercepts_, theirs.coefs_ + theirs.intercepts_):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(ours.loss_curve_, theirs.loss_curve_, rtol=1e-9)


def test_weights_set_to_nan_or_inf_are_named_as_coefs(rng):
    """coefs_ given NaN or inf is refused naming coefs_ and the index in its own layout (the net's transposed
    one was named, with 'use a wider dtype'); set in place through the views, the next warm fit or partial_fit
    names them (it blamed the input's size)."""
    x, y = _regression(rng, n=60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        reg = MLPRegressor(hidden_layer_sizes=(4,), max_iter=2, random_state=0, warm_start=True).fit(x, y)
    bad = [c.copy() for c in reg.coefs_]
    bad[0][3, 1] = np.inf
    with pytest.raises(ValueError, match=r"coefs_\[0\] holds inf at index \(3, 1\)"):
        reg.coefs_ = bad
    reg.coefs_[0][3, 1] = np.nan
    for fit in (reg.fit, reg.partial_fit):
        with pytest.raises(ValueError, match="coefs_ or intercepts_ hold NaN or inf"):
            fit(x, y)


def test_data_past_a_float32_nets_range_is_named_as_x_or_y(rng):
    x, y = _regression(rng, n=60)
    reg = MLPRegressor(hidden_layer_sizes=(4,), max_iter=2, dtype=np.float32)
    with pytest.raises(ValueError, match=r"^y holds 1e\+39 at index \(5, 0\), past the range of the net's float32"):
        reg.fit(x, np.where(np.arange(60) == 5, 1e39, y))
    with pytest.raises(ValueError, match=r"^X holds -1e\+39 at index \(2, 4\)"):
        reg.fit(np.where((np.arange(60) == 2)[:, None] & (np.arange(5) == 4), -1e39, x), y)


def test_a_fit_refused_before_training_keeps_the_fitted_model(rng):
    """A new fit refused for its data (past a float32 net's range, found when the net had been made anew) and a
    warm fit refused after its net was rebuilt for set_params (a validation set too small) leave the estimator
    as it was: its net, its features, its predictions."""
    x, y = rng.random((60, 7)), rng.integers(0, 3, 60)
    clf = MLPClassifier(hidden_layer_sizes=(5,), max_iter=3, dtype=np.float32, random_state=0).fit(x, y)
    net, before = clf.net_, clf.predict_proba(x)
    bad = rng.random((60, 5))
    bad[0, 0] = 1e300
    with pytest.raises(ValueError, match=r"^X holds 1e\+300 at index \(0, 0\)"):
        clf.fit(bad, y)
    clf.set_params(warm_start=True, strategy="sqrt", early_stopping=True, validation_fraction=0.01)
    with pytest.raises(ValueError, match="validation_fraction=0.01 of 60 samples holds out 1"):
        clf.fit(x, y)
    assert clf.net_ is net and clf.n_features_in_ == 7 and str(clf.net_.strategy) == "plain"
    np.testing.assert_array_equal(clf.predict_proba(x), before)


def test_a_plan_refused_after_set_params_keeps_the_fitted_net(rng):
    """A warm fit whose new dtype and strategy cannot be planned (InfeasiblePlan, raised when the net's step was
    first planned, in training) kept the net rebuilt in float32: the fitted net and its bits stay."""
    from fastckpt import InfeasiblePlan
    x, y = rng.random((200, 5)), rng.integers(0, 3, 200)
    clf = MLPClassifier((8,), max_iter=5, random_state=0, warm_start=True).fit(x, y)
    net, before = clf.net_, clf.predict_proba(x)
    with pytest.raises(InfeasiblePlan, match=r"^fit\(10\): "):
        clf.set_params(dtype=np.float32, strategy="fit(10)").fit(x, y)
    assert clf.net_ is net and clf.net_.dtype == np.float64 and str(clf.net_.strategy) == "plain"
    np.testing.assert_array_equal(clf.predict_proba(x), before)


def test_a_warm_fit_that_diverges_counts_the_epochs_it_trained(rng):
    """A warm fit stopped by a non-finite loss keeps the epochs before it: its counters and curve count them
    (they stayed at the last fit's while the weights had moved on)."""
    x, y = rng.random((200, 5)), rng.integers(0, 3, 200)
    clf = MLPClassifier((8,), max_iter=5, random_state=0, warm_start=True, solver="sgd").fit(x, y)
    with pytest.raises(ValueError, match=r"the epochs before it were kept: n_iter_ counts them"):
        clf.set_params(learning_rate_init=1e300, max_iter=10).fit(x, y)
    assert 0 < clf.n_iter_ < 10 and len(clf.loss_curve_) == 5 + clf.n_iter_ and clf.t_ == 200 * (5 + clf.n_iter_)
    assert all(np.isfinite(w).all() for w in clf.coefs_) and max(np.abs(w).max() for w in clf.coefs_) > 1e100


def _warm_pair(max_iter):
    """fastckpt's and scikit-learn's MLPRegressor with the same warm-started SGD settings."""
    common = dict(hidden_layer_sizes=(8,), solver="sgd", momentum=0.9, batch_size=50, shuffle=False,
                  random_state=0, max_iter=max_iter, learning_rate_init=0.01, warm_start=True)
    return MLPRegressor(**common), neural_network.MLPRegressor(**common)


def test_a_warm_start_and_partial_fits_go_on_as_scikit_learns(rng):
    """A warm start keeps the weights and the count of epochs without improvement but makes a new optimizer;
    partial_fit keeps the optimizer too: scikit-learn's weights and loss curve after each."""
    x, y = _regression(rng)
    ours, theirs = _warm_pair(max_iter=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for model in (ours, theirs):
            model.fit(x, y).fit(x, y)
            model.partial_fit(x, y)
            model.partial_fit(x, y)
    for a, b in zip(ours.coefs_ + ours.intercepts_, theirs.coefs_ + theirs.intercepts_):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(ours.loss_curve_, theirs.loss_curve_, rtol=1e-11)
    assert (ours.t_, ours.n_iter_, ours.best_loss_) == (theirs.t_, theirs.n_iter_, pytest.approx(theirs.best_loss_))


@pytest.mark.parametrize("params, message", [
    ({"solver": "lbfgs"}, "solver must be one of 'adam', 'sgd', got 'lbfgs'"),
    ({"activation": "softplus"}, "activation must be one of 'identity', 'logistic', 'tanh', 'relu', got 'softplus'"),
    ({"hidden_layer_sizes": (10, 0)}, "hidden_layer_sizes must be >= 1, got 0"),
    ({"learning_rate_init": 0}, "learning_rate_init must be finite and > 0, got 0"),
    ({"learning_rate_init": -1}, "learning_rate_init must be finite and > 0, got -1"),
    ({"learning_rate_init": float("nan")}, "learning_rate_init must be finite and > 0, got nan"),
    ({"strategy": "every_nth(0)"}, "every_nth"),
    ({"hidden_layer_sizes": (n for n in (4, 3))}, "hidden_layer_sizes must be an int or a sequence of ints"),
    ({"momentum": 1.5, "solver": "sgd"}, "momentum must be in [0, 1], got 1.5"),
    ({"dtype": "junk"}, "dtype must be float32 or float64, got 'junk'"),
    ({"momentum": 1.5, "solver": "adam"}, "momentum must be in [0, 1], got 1.5"),   # checked whatever the solver
    ({"beta_1": 5.0, "solver": "sgd"}, "beta_1 must be in [0, 1), got 5.0"),
    ({"epsilon": -1, "solver": "sgd"}, "epsilon must be finite and >= 0, got -1"),
    ({"verbose": "loud"}, "verbose must be True, False or an int, got 'loud'"),
    ({"loss": "poisson"}, "loss must be 'squared_error' (fastckpt has no Poisson output), got 'poisson'"),
])
def test_bad_arguments_are_named_in_fit(rng, params, message):
    x, y = _regression(rng, n=20)
    reg = MLPRegressor(**params)                                  # __init__ stores them as given
    with pytest.raises((ValueError, TypeError)) as info:
        reg.fit(x, y)
    assert message in str(info.value)


def test_verbose_prints_scikit_learns_lines(rng, capsys):
    x, y = _regression(rng, n=60)
    with pytest.warns(ConvergenceWarning, match=r"Maximum iterations \(2\) reached"):     # as scikit-learn's says
        MLPRegressor(hidden_layer_sizes=(4,), max_iter=2, verbose=True, random_state=0, early_stopping=True).fit(x, y)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(",")[0].split(":")[0] for line in lines] == ["Iteration 1", "Validation score",
                                                                   "Iteration 2", "Validation score"]


@pytest.mark.bounds
def test_max_memory_refuses_a_fit_before_training_with_its_parts(rng):
    x, y = rng.standard_normal((20_000, 50)), rng.integers(0, 5, 20_000)
    clf = MLPClassifier((256,) * 8, max_iter=1, batch_size=2000, max_memory="40MiB", random_state=0)
    with pytest.raises(ValueError, match=r"max_memory 40MiB: this run needs 59\.\d\d MiB with strategy plain \(data "
                                         r"7\.78 MiB, step: total 50\.\d\d MiB, .*besides 316\.25 KiB\); "
                                         r"strategy='fit\(\d+\)' plans a step"):
        clf.fit(x, y)                       # besides: the labels as class indices and the estimator's objects
    assert not hasattr(clf, "loss_")                                 # refused before the first update
    with pytest.raises(ValueError, match=r"max_memory 1MiB: the data the fit holds needs 8,320,000 bytes, before"):
        clf.set_params(max_memory="1MiB").fit(x, y)
    clf.set_params(max_memory="40MiB", strategy="sqrt", hidden_layer_sizes=(64,) * 8).fit(x[:4000], y[:4000])


@pytest.mark.memory
@pytest.mark.bounds
@pytest.mark.parametrize("early_stopping, bound, order", [(False, 14 * MiB, "C"), (True, 18 * MiB, "C"),
                                                          (False, 14 * MiB, "F")], ids=["plain", "early", "fortran"])
@pytest.mark.sweep("plain", "fortran")
def test_max_memory_bounds_the_whole_fit_as_memray_measures_it(early_stopping, bound, order):
    """The data made inside the measured function, so all of the fit is measured (with early stopping: the
    validation split's copies, its pass and the best weights too); plain would need more than the bound, the fit
    strategy it names trains within it, and the prediction is close to memray's peak.  Fortran-ordered X (as a
    DataFrame's values often are): a shuffled minibatch was gathered by np.take, which copied all of X first."""
    from fastckpt.report.measure import memray_peak

    def data():
        rng = np.random.default_rng(7)
        return np.asarray(rng.standard_normal((6000, 50)), order=order), rng.integers(0, 10, 6000)
    settings = dict(hidden_layer_sizes=(128,) * 8, max_iter=2, batch_size=1000, random_state=0,
                    early_stopping=early_stopping, n_iter_no_change=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        with pytest.raises(ValueError, match="strategy='fit") as refused:
            MLPClassifier(**settings, max_memory=bound).fit(*data())
        fit = refused.value.args[0].split("strategy='")[1].split("'")[0]
        MLPClassifier(**settings, strategy=fit).fit(*data())              # warm-up: kernels, BLAS buffers
        held = {}

        def run():
            held["clf"] = MLPClassifier(**settings, strategy=fit, max_memory=bound).fit(*data())
        peak = memray_peak(run)
    assert peak <= bound and held["clf"].net_.plan(1000).recompute_factor > 1, (peak, fit)
    assert peak > bound - 2 * MiB, (peak, fit)                             # and close to it


def test_a_fit_refused_by_max_memory_leaves_the_estimator_as_it_was(rng):
    """A warm fit refused before training keeps the fitted net, its dtype, weights and optimizer state (a
    rebuilt float32 net was left in place); a first fit refused leaves no net to predict with, and a new fit of
    a fitted estimator refused keeps the fitted one (it was thrown away)."""
    from sklearn.exceptions import NotFittedError
    x, y = rng.standard_normal((300, 10)), rng.integers(0, 3, 300)
    clf = MLPClassifier(hidden_layer_sizes=(32, 32), max_iter=1, warm_start=True, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(x, y)
    net, state, weights = clf.net_, clf.net_.optimizer_state, [c.copy() for c in clf.coefs_]
    for change in ({"dtype": np.float32}, {"strategy": "sqrt"}, {}):
        clf.set_params(**change, max_memory="64KiB")
        with pytest.raises(ValueError, match="max_memory 64KiB"):
            clf.fit(x, y)
        assert clf.net_ is net and clf.net_.optimizer_state is state
        for got, want in zip(clf.coefs_, weights):
            np.testing.assert_array_equal(got, want)
        clf.set_params(dtype=np.float64, strategy="plain", max_memory=None)
    first = MLPClassifier(hidden_layer_sizes=(32,), max_memory="64KiB")
    with pytest.raises(ValueError, match="max_memory 64KiB"):
        first.fit(x, y)
    with pytest.raises(NotFittedError):
        first.predict(x)
    assert not hasattr(first, "n_features_in_") and not hasattr(first, "classes_")
    cold = MLPClassifier(hidden_layer_sizes=(32,), max_iter=1, random_state=0)      # a new fit, not a warm one
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        cold.fit(x, y)
    kept = (cold.net_, cold.n_iter_, cold.t_, list(cold.loss_curve_), cold.predict(x))
    with pytest.raises(ValueError, match="max_memory 64KiB"):
        cold.set_params(max_memory="64KiB").fit(x[:100], y[:100])
    assert (cold.net_, cold.n_iter_, cold.t_, cold.loss_curve_) == kept[:4]
    np.testing.assert_array_equal(cold.predict(x), kept[4])


@pytest.mark.memory
@pytest.mark.parametrize("change", [{"dtype": np.float32}, {"optimizer_in_backward": True}, {}],
                         ids=["dtype", "fused", "same"])
def test_max_memory_counts_the_net_a_warm_fit_replaces(rng, change):
    """A warm fit after set_params that builds the net anew holds the fitted net and the new one at once: the
    least bound it takes (on a grid of 1 MiB) holds what memray measures of making the fitted net (unpickled)
    and then the warm fit; a warm fit that keeps its net starts its optimizer again in place.  A rebuild was
    accepted with 14 MiB and peaked at 15.9; a warm fit without one held a second optimizer state."""
    from fastckpt.report.measure import memray_peak
    x, y = rng.standard_normal((1000, 50)), np.arange(1000) % 5

    def fitted(rows):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            return MLPClassifier(hidden_layer_sizes=(512,) * 4, max_iter=1, batch_size=100, random_state=0,
                                 warm_start=True).fit(x[:rows], y[:rows])

    def warm(clf, bound):
        clf.set_params(**change, max_memory=bound)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            return clf.fit(x, y)
    blob = pickle.dumps(fitted(1000))                  # unpickled inside the measure: the fitted net, no more
    clf = pickle.loads(blob)
    for mib in range(8, 80):
        try:
            warm(clf, mib * MiB)
            break
        except ValueError:
            assert clf.net_.params.dtype == np.float64 and not clf.net_.plan(100).optimizer_in_backward
    warm(pickle.loads(blob), mib * MiB)                               # warm-up: kernels, BLAS buffers
    peak = memray_peak(lambda: warm(pickle.loads(blob), mib * MiB))
    assert peak <= mib * MiB, (peak, mib)


@pytest.mark.memory
@pytest.mark.parametrize("early_stopping", [False, True], ids=["plain", "early"])
def test_the_least_bound_a_fit_takes_holds_it(early_stopping):
    """At the least max_memory a fit takes (to 4 KiB), memray's peak of the fit and the data it was given stay
    within it: a fit made ~100 KiB of Python objects (scikit-learn's checks, ABC caches) more than counted."""
    from fastckpt.report.measure import memray_peak
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((6000, 50)), rng.integers(0, 5, 6000)
    settings = dict(hidden_layer_sizes=(64, 64), max_iter=1, batch_size=500, random_state=0,
                    early_stopping=early_stopping)

    def fit(bound):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            return MLPClassifier(**settings, max_memory=bound).fit(x, y)
    low, high = 1 * MiB, 64 * MiB
    while high - low > 4096:
        try:
            fit((low + high) // 2)
            high = (low + high) // 2
        except ValueError:
            low = (low + high) // 2
    fit(high)                                                         # warm-up
    peak = memray_peak(lambda: fit(high))
    assert peak + x.nbytes + y.nbytes <= high, (peak + x.nbytes + y.nbytes, high)


def test_float16_data_fits_as_its_float64_values(rng):
    """scikit-learn's MLPs take float16 X and y; here they are the net's dtype before the kernels see them."""
    x, y = _regression(rng, n=60)
    half = dict(hidden_layer_sizes=(5,), max_iter=3, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        got = MLPRegressor(**half).fit(x.astype(np.float16), y.astype(np.float16)).predict(x)
        want = MLPRegressor(**half).fit(x.astype(np.float16).astype(float), y.astype(np.float16).astype(float))
        clf = MLPClassifier(**half).fit(x.astype(np.float16), y > 0)
    np.testing.assert_array_equal(got, want.predict(x))
    assert clf.predict(x.astype(np.float16)).shape == (60,)


def test_settings_changed_under_a_warm_start_are_used_as_scikit_learns_are(rng):
    """set_params between warm fits: the new activation and solver train on from the fitted weights, as
    scikit-learn's own MLP does (weights and loss curve equal); other layers are refused, naming them."""
    x, y = _regression(rng)
    ours, theirs = _warm_pair(max_iter=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for model in (ours, theirs):
            model.fit(x, y)
            model.set_params(activation="tanh", momentum=0.5, nesterovs_momentum=False)
            model.fit(x, y)
    for a, b in zip(ours.coefs_ + ours.intercepts_, theirs.coefs_ + theirs.intercepts_):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ours.loss_curve_, theirs.loss_curve_, rtol=1e-10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for model in (ours, theirs):                      # Adam's epsilon: 1e-4 (test above)
            model.set_params(solver="adam").fit(x, y)
    assert repr(ours.net_.optimizer).startswith("adam(")
    for a, b in zip(ours.coefs_ + ours.intercepts_, theirs.coefs_ + theirs.intercepts_):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    fitted = [c.copy() for c in ours.coefs_]
    ours.set_params(dtype=np.float32, max_iter=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours.fit(x, y)
    assert ours.coefs_[0].dtype == np.float32 and not np.array_equal(ours.coefs_[0], fitted[0].astype(np.float32))
    ours.set_params(hidden_layer_sizes=(7, 3))
    with pytest.raises(ValueError, match=r"hidden_layer_sizes=\(7, 3\) differs from the fitted net's \(8,\)"):
        ours.fit(x, y)


def test_max_memory_counts_the_whole_array_a_view_keeps_alive(rng):
    """A strided view of X holds all of X: the bound counts X (it counted the view's own half, and a fit under
    24 MiB peaked at 29.9 MiB under memray)."""
    from fastckpt.sklearn.data import held
    whole = rng.standard_normal((400, 20))
    view, rows = whole[:, ::2], whole[::2]
    assert [a is whole for a in held(view, rows, whole)] == [True]
    other = np.ones(3)
    assert len(held(view, other[1:], other)) == 2
    y = rng.integers(0, 3, 400)
    est = MLPClassifier(hidden_layer_sizes=(4,), max_iter=1, max_memory=whole.nbytes - 1)
    with pytest.raises(ValueError, match=r"max_memory .*: the data the fit holds needs|the whole run needs"):
        est.fit(view, y)
