"""Background prefetch: same items in order, bounded look-ahead, errors and shutdown."""

import threading
import time

import pytest

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
def test_makes_at_most_depth_items_ahead(depth):
    made = []

    def items():
        for i in range(10):
            made.append(i)
            yield i

    def settle(count):
        deadline = time.monotonic() + 10
        while len(made) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # time to make more, were it allowed to
        return len(made)

    with Prefetcher(items(), depth) as feed:
        assert settle(depth) == depth  # nothing taken yet
        assert next(feed) == 0
        assert settle(depth + 1) == depth + 1


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
    assert finished.wait(5) and not _threads()  # the generator was closed
    with pytest.raises(StopIteration):
        next(feed)


def test_an_exception_in_the_consumer_loop_stops_the_thread():
    with pytest.raises(KeyError), Prefetcher(iter(range(100)), 3) as feed:
        next(feed)
        raise KeyError("diverged")
    assert not _threads()


def test_wait_fraction_is_the_share_of_wall_time_spent_blocked():
    def slow():
        for i in range(4):
            time.sleep(0.1)
            yield i

    feed = Prefetcher(slow(), 2)
    list(feed)
    assert 0.8 < feed.wait_fraction() <= 1.0  # the consumer only waited
    fast = Prefetcher(iter(range(4)), 2)
    time.sleep(0.1)
    for _ in fast:
        time.sleep(0.1)  # the consumer's own work
    assert 0.0 <= fast.wait_fraction() < 0.2
    assert fast.wait_fraction() <= 1.0  # a new, empty interval


@pytest.mark.parametrize("depth", [-1, 1.5, True])
def test_invalid_depth(depth):
    with pytest.raises(ValueError, match="prefetch depth"):
        Prefetcher(range(3), depth)
