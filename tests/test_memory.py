"""calib_jax._memory: available memory and the up-front size check."""

from __future__ import annotations

import io

import pytest

from calib_jax import _memory


@pytest.mark.parametrize(
    "nbytes, text",
    [
        (0, "0 bytes"),
        (999, "999 bytes"),
        (1000, "1.0 kB"),
        (20_125_000_352, "20.1 GB"),
        (300_005_811_512, "300.0 GB"),
        (11_300_000_000, "11.3 GB"),
        (10**21, "1000.0 EB"),
    ],
)
def test_human_bytes(nbytes, text):
    assert _memory.human_bytes(nbytes) == text


def test_check_fits_passes_what_fits():
    _memory.check_fits(10, "x", fix="lower x", available=10)
    _memory.check_fits(2**40, "x", fix="lower x", available=2**41)


def test_check_fits_raises_one_line_with_both_sizes_and_the_fix():
    with pytest.raises(ValueError) as info:
        _memory.check_fits(
            20_125_000_352,
            "num_bins=100000000 (ECE bins)",
            fix="lower --num_bins.",
            available=11_300_000_000,
        )
    assert str(info.value) == (
        "num_bins=100000000 (ECE bins) needs about 20.1 GB; this device has "
        "11.3 GB available; lower --num_bins."
    )


def test_check_fits_takes_python_ints_beyond_int64():
    with pytest.raises(ValueError, match="needs about 100000000.0 EB"):
        _memory.check_fits(10**26, "k", fix="f", available=1)


def test_check_fits_uses_the_measured_amount_and_skips_when_unknown(monkeypatch):
    monkeypatch.setattr(_memory, "available_bytes", lambda device=None: 5_000)
    with pytest.raises(ValueError, match="has 5.0 kB available"):
        _memory.check_fits(5_001, "x", fix="f")
    _memory.check_fits(5_000, "x", fix="f")
    monkeypatch.setattr(_memory, "available_bytes", lambda device=None: None)
    _memory.check_fits(10**30, "x", fix="f")  # nothing known, nothing refused


def test_host_available_reads_meminfo(monkeypatch):
    meminfo = "MemTotal: 16000000 kB\nMemFree: 100 kB\nMemAvailable: 1234 kB\n"
    real_open = open

    def fake_open(path, *args, **kwargs):
        if path == "/proc/meminfo":
            return io.StringIO(meminfo)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", fake_open)
    assert _memory._host_available() == 1234 * 1024


def test_host_available_falls_back_to_sysconf(monkeypatch):
    def no_meminfo(path, *args, **kwargs):
        raise FileNotFoundError(path)

    monkeypatch.setattr("builtins.open", no_meminfo)
    pages = {"SC_AVPHYS_PAGES": 3, "SC_PAGE_SIZE": 4096}
    monkeypatch.setattr(_memory.os, "sysconf", pages.__getitem__)
    assert _memory._host_available() == 3 * 4096


class _Device:
    def __init__(self, platform, stats):
        self.platform, self._stats = platform, stats

    def memory_stats(self):
        if isinstance(self._stats, Exception):
            raise self._stats
        return self._stats


def test_available_bytes_on_an_accelerator_is_limit_minus_use(monkeypatch):
    monkeypatch.setattr(_memory, "_host_available", lambda: 7)
    gpu = _Device("gpu", {"bytes_limit": 80_000, "bytes_in_use": 30_000})
    assert _memory.available_bytes(gpu) == 50_000
    # No statistics, or a backend that raises: the host's memory.
    assert _memory.available_bytes(_Device("tpu", None)) == 7
    assert _memory.available_bytes(_Device("tpu", RuntimeError("no"))) == 7
    # The CPU's statistics are not the allocator's limit: the host's memory.
    assert _memory.available_bytes(_Device("cpu", {"bytes_limit": 1})) == 7


def test_available_bytes_on_this_host_is_positive():
    assert _memory.available_bytes() > 0
