"""Background prefetch: same items in order, bounded look-ahead, errors and shutdown."""

import threading
from types import SimpleNamespace

import pytest

from calib_jax.data import prefetch
from calib_jax.data.prefetch import Prefetcher


def _threads():
    return [t for t in threading.enumerate() if t.name == "calib_jax-prefetch"]


@pytest.mark.parametrize("depth", [0, 1, 2, 5])
def test_yields_every_item_in_order_then_stops(depth):
    with Prefetcher((i * i for i in range(20)), depth) as feed:
        assert list(feed) == [i * i for i in range(20)]
        with pytest.raises(StopIteration):
            next(feed)
    assert not _threads()


@pytest.mark.parametrize("depth", [1, 3])
def test_makes_at_most_depth_items_ahead(depth, monkeypatch):
    made = []
    asked = []  # len(made) each time the producer asks for a slot
    changed = threading.Condition()
    acquire_slot = Prefetcher._acquire_slot

    def spy(self):
        with changed:
            asked.append(len(made))
            changed.notify_all()
        return acquire_slot(self)

    monkeypatch.setattr(Prefetcher, "_acquire_slot", spy)

    def items():
        for i in range(10):
            made.append(i)
            yield i

    def asks_for_item(index):
        # Blocks until the producer asks for the slot of item `index` (the
        # timeout only guards against a hang); returns the items made by then.
        with changed:
            assert changed.wait_for(lambda: len(asked) > index, timeout=120)
            return len(made)

    with Prefetcher(items(), depth) as feed:
        assert asks_for_item(depth) == depth  # nothing taken yet
        assert not feed._slots.acquire(blocking=False)  # all depth slots held
        assert next(feed) == 0
        assert asks_for_item(depth + 1) == depth + 1
        assert not feed._slots.acquire(blocking=False)
    assert asked[: depth + 2] == list(range(depth + 2))


def test_depth_zero_makes_items_on_the_calling_thread():
    seen = []
    feed = Prefetcher(
        (seen.append(threading.current_thread()) or i for i in range(3)), 0
    )
    assert list(feed) == [0, 1, 2]
    assert seen == [threading.main_thread()] * 3 and not _threads()


@pytest.mark.parametrize("depth", [0, 2])
def test_a_producer_exception_reaches_the_consumer_and_the_thread_ends(depth):
    def items():
        yield 1
        yield 2
        raise OSError("disk gone at item 3")

    feed = Prefetcher(items(), depth)
    assert next(feed) == 1 and next(feed) == 2
    with pytest.raises(OSError, match="disk gone at item 3"):
        next(feed)
    with pytest.raises(StopIteration):
        next(feed)
    assert not _threads()


def test_close_stops_a_producer_blocked_on_a_full_queue():
    finished = threading.Event()

    def items():
        try:
            yield from range(1000)
        finally:
            finished.set()

    with Prefetcher(items(), 2) as feed:
        assert next(feed) == 0
    # close() joined the thread, which closed the generator before it ended.
    assert finished.is_set() and not _threads()
    with pytest.raises(StopIteration):
        next(feed)


def test_an_exception_in_the_consumer_loop_stops_the_thread():
    with pytest.raises(KeyError), Prefetcher(iter(range(100)), 3) as feed:
        next(feed)
        raise KeyError("diverged")
    assert not _threads()


def test_wait_fraction_is_the_share_of_wall_time_spent_blocked(monkeypatch):
    # A clock the test moves: 0.1 s inside next() (the item takes that long
    # to make) or outside it (the consumer's own work); no real time counts.
    clock = [100.0]
    monkeypatch.setattr(
        prefetch, "time", SimpleNamespace(perf_counter=lambda: clock[0])
    )

    def slow():
        for i in range(4):
            clock[0] += 0.1
            yield i

    feed = Prefetcher(slow(), 0)
    assert list(feed) == [0, 1, 2, 3]
    assert feed.wait_fraction() == pytest.approx(1.0)  # the consumer only waited
    fast = Prefetcher(iter(range(4)), 0)
    clock[0] += 0.1
    for _ in fast:
        clock[0] += 0.1  # the consumer's own work
    assert fast.wait_fraction() == 0.0
    with Prefetcher(slow(), 0) as half:
        clock[0] += 0.4
        for _ in half:
            clock[0] += 0.1
    assert half.wait_fraction() == pytest.approx(0.4 / 1.2)
    assert half.wait_fraction() == 0.0  # a new, empty interval


@pytest.mark.parametrize("depth", [-1, 1.5, True])
def test_invalid_depth(depth):
    with pytest.raises(ValueError, match="prefetch depth"):
        Prefetcher(range(3), depth)
