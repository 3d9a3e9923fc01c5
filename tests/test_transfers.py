"""One device-to-host transfer per eager call (issue 21, deliverable 5).

An eager metric or fitter moves its value checks and its result to the host
together (``calib_jax._checks.fetch``); the caller's ``float(result)`` or
``np.asarray(result)`` then reads the host copy that a fetched ``jax.Array``
keeps, without a second round trip.

How transfers are counted. On the CPU backend ``jax.transfer_guard`` never
fires for device-to-host reads (a CPU buffer is host memory, read without a
copy), so :func:`count_transfers` counts the Python-level fetch points
instead: each ``jax.device_get`` call that includes an array not fetched
before is one transfer; so is a read of an unfetched array's host value
outside one (``float``/``int``/``bool``/formatting go through
``Array._value``; ``np.asarray``/``np.array`` are wrapped, as on the CPU they
read the buffer directly). An array read once counts as fetched from then on,
as on a GPU, where the fetch caches its host copy. On any other backend the
calls also run under ``jax.transfer_guard_device_to_host('disallow')``: any
implicit fetch besides the counted explicit one raises.
"""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import array as jax_array

from calib_jax import metrics, posthoc


class _Counter:
    def __init__(self):
        self.count = 0
        self._seen = []  # strong references, so that ids are not reused
        self._ids = set()
        self._inside = 0

    def _unfetched(self, x) -> bool:
        return (
            isinstance(x, jax.Array)
            and not isinstance(x, jax.core.Tracer)
            and id(x) not in self._ids
        )

    def _mark(self, x) -> None:
        self._seen.append(x)
        self._ids.add(id(x))

    def read(self, x) -> None:
        """A host read of ``x`` outside ``jax.device_get``."""
        if not self._inside and self._unfetched(x):
            self.count += 1
            self._mark(x)


@contextlib.contextmanager
def count_transfers(monkeypatch):
    """Yields a counter of device-to-host round trips (see the module docstring)."""
    counter = _Counter()
    device_get, value = jax.device_get, jax_array.ArrayImpl._value
    asarray, array = np.asarray, np.array

    def counted_device_get(x):
        new = [leaf for leaf in jax.tree.leaves(x) if counter._unfetched(leaf)]
        if new and not counter._inside:
            counter.count += 1
        for leaf in new:
            counter._mark(leaf)
        counter._inside += 1
        try:
            return device_get(x)
        finally:
            counter._inside -= 1

    def counted_value(self):
        counter.read(self)
        return value.fget(self)

    def wrap(fn):
        def counted(x, *args, **kwargs):
            counter.read(x)
            return fn(x, *args, **kwargs)

        return counted

    monkeypatch.setattr(jax, "device_get", counted_device_get)
    monkeypatch.setattr(jax_array.ArrayImpl, "_value", property(counted_value))
    monkeypatch.setattr(np, "asarray", wrap(asarray))
    monkeypatch.setattr(np, "array", wrap(array))
    if jax.default_backend() == "cpu":
        guard = contextlib.nullcontext()
    else:
        guard = jax.transfer_guard_device_to_host("disallow")
    with guard:
        yield counter


def _probs(n=96, k=5, seed=0):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, k)).astype(np.float32) * 2.0
    y = np.argmax(z + rng.gumbel(size=(n, k)), axis=1).astype(np.int32)
    p = np.exp(z - z.max(1, keepdims=True))
    return jnp.asarray(z), jnp.asarray(p / p.sum(1, keepdims=True)), jnp.asarray(y)


def test_counter_counts_reads_and_fetches(monkeypatch):
    """The counter itself: a float() of a fresh array is one transfer, a
    device_get of two fresh arrays one, a read of a fetched array none."""
    a, b, c = (jnp.arange(3.0) + i for i in range(3))
    total = jnp.sum(a)
    with count_transfers(monkeypatch) as counter:
        assert float(total) == 3.0
        assert counter.count == 1
        jax.device_get((b, c))
        assert counter.count == 2
        float(total), np.asarray(b), np.asarray(c)
        assert counter.count == 2
        np.asarray(a)
        assert counter.count == 3


def test_fetched_array_keeps_host_copy():
    """What the counter assumes of a fetched array: off the CPU, device_get
    caches the host copy on the array; on the CPU nothing is copied."""
    x = jax.jit(lambda v: v * 2.0)(jnp.arange(4.0))
    jax.device_get((x, jnp.zeros(())))
    if jax.default_backend() == "cpu":
        # Read in place: every host view is the buffer itself, never a copy.
        first, second = np.asarray(x), np.asarray(x)
        assert np.shares_memory(first, second)
        np.testing.assert_array_equal(first, [0.0, 2.0, 4.0, 6.0])
        return
    with jax.transfer_guard_device_to_host("disallow"):
        np.testing.assert_array_equal(np.asarray(x), [0.0, 2.0, 4.0, 6.0])


@pytest.mark.parametrize(
    "call",
    [
        lambda p, y: metrics.ece(p, y),
        lambda p, y: metrics.adaptive_ece(p, y),
        lambda p, y: metrics.classwise_ece(p, y, where=jnp.arange(96) % 7 != 3),
        lambda p, y: metrics.brier(p, y),
        lambda p, y: metrics.summary(p, y, names=("accuracy", "ece", "nll")),
        lambda p, y: metrics.ece_consistency_test(
            p, y, key=jax.random.key(0), num_samples=9, num_bins=5
        ),
    ],
    ids=["ece", "adaptive_ece", "classwise_ece_where", "brier", "summary", "test"],
)
@pytest.mark.long
def test_eager_metric_is_one_transfer(monkeypatch, call):
    _, p, y = _probs()
    with count_transfers(monkeypatch) as counter:
        out = call(p, y)
        values = [float(v) for v in jax.tree.leaves(out)]
        np.asarray(jax.tree.leaves(out)[0])
    assert counter.count == 1
    assert all(np.isfinite(values))


def test_eager_metric_value_is_unchanged(monkeypatch):
    """The fetched result is the metric's value: the equal-width ECE of a
    float64 NumPy histogram (15 bins, top label)."""
    _, p, y = _probs()
    p64, y64 = np.asarray(p, np.float64), np.asarray(y)
    conf, pred = p64.max(1), p64.argmax(1)
    bins = np.minimum((conf * 15).astype(int), 14)
    ref = sum(
        abs(np.mean(pred[bins == b] == y64[bins == b]) - conf[bins == b].mean())
        * np.mean(bins == b)
        for b in range(15)
        if np.any(bins == b)
    )
    with count_transfers(monkeypatch) as counter:
        value = float(metrics.ece(p, y))
    assert counter.count == 1
    np.testing.assert_allclose(value, ref, rtol=1e-5, atol=1e-6)


def test_eager_fit_ts_is_one_transfer(monkeypatch):
    z, _, y = _probs(n=256, k=4, seed=1)
    with count_transfers(monkeypatch) as counter:
        cal = posthoc.fit("ts", z, y)
        t = float(cal.params["temperature"])
        np.asarray(cal.params["temperature"])
    assert counter.count == 1
    # The NLL is stationary in log T at the fitted temperature (float64).
    z64, y64 = np.asarray(z, np.float64), np.asarray(y)

    def nll(temp):
        s = z64 / temp
        s = s - s.max(1, keepdims=True)
        return np.mean(np.log(np.exp(s).sum(1)) - s[np.arange(len(y64)), y64])

    h = 1e-3
    slope = (nll(t * np.exp(h)) - nll(t * np.exp(-h))) / (2 * h)
    assert abs(slope) < 1e-3


def test_eager_errors_still_raise(monkeypatch):
    """The checks still run on the fetched summary."""
    z, p, y = _probs()
    bad = p.at[5, 0].set(jnp.nan)
    with pytest.raises(ValueError, match="row 5"):
        metrics.ece(bad, y)
    z, _, y = _probs(n=256, k=4, seed=1)  # the fit compiled for the TS test above
    with pytest.raises(ValueError, match="row 7"):
        posthoc.fit("ts", z.at[7, 1].set(jnp.inf), y)
