"""posthoc.load of tampered or corrupt files: always a one-line ValueError
naming the file and what is wrong, never a silently wrong calibrator and
never another exception; Calibrator.apply on logits of another K."""

from __future__ import annotations

import io
import json
import struct
import zipfile

import jax
import numpy as np
import pytest
from posthoc._data import overconfident

from calib_jax import posthoc

Z, Y = overconfident(200, 4, seed=0)


class _SavedFits(dict):
    """name -> (path, header, arrays) of a saved fit on (Z, Y), made on first use.

    Under ``pytest -n`` a worker fits (and compiles) only the maps of the
    tests it runs.
    """

    def __init__(self, directory):
        super().__init__()
        self.directory = directory

    def __missing__(self, name):
        path = self.directory / f"{name}.npz"
        posthoc.fit(name, Z, Y).save(path)
        with np.load(path) as f:
            header = json.loads(str(f["__header__"]))
            arrays = {k: f[k] for k in f.files if k != "__header__"}
        self[name] = (path, header, arrays)
        return self[name]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> (path, header, arrays) of a saved fit of each map used here."""
    return _SavedFits(tmp_path_factory.mktemp("saved"))


def _write(path, header, arrays, header_text=None):
    buf = io.BytesIO()
    text = json.dumps(header) if header_text is None else header_text
    np.savez(buf, __header__=np.array(text), **arrays)
    path.write_bytes(buf.getvalue())
    return path


def _load_error(path) -> str:
    with pytest.raises(ValueError) as err:
        posthoc.load(path)
    text = str(err.value)
    assert "\n" not in text and str(path) in text, text
    return text


def _flip(src, dst, member):
    """``src`` with one byte of ``member``'s data flipped (its CRC fails)."""
    raw = bytearray(src.read_bytes())
    info = zipfile.ZipFile(src).getinfo(member)
    n, e = struct.unpack("<HH", raw[info.header_offset + 26 : info.header_offset + 30])
    raw[info.header_offset + 30 + n + e + info.compress_size - 2] ^= 0x10
    dst.write_bytes(bytes(raw))
    return dst


@pytest.mark.parametrize("member", ["p0.npy", "__header__.npy"])
def test_flipped_byte_is_one_line(saved, tmp_path, member):
    path = _flip(saved["ts"][0], tmp_path / "flipped.npz", member)
    text = _load_error(path)
    assert "is corrupt: an array entry does not read back (BadZipFile)" in text or (
        "has an unreadable __header__ entry" in text
    )


@pytest.mark.parametrize(
    "params, message",
    [
        ({}, "a structure node must be a non-empty object, got {}"),
        ([], "a structure node must be a non-empty object, got []"),
        ({"dict": {"a": 1}}, "a dict node must list [key, node] pairs"),
        ({"magic": 1}, "unknown structure node 'magic'"),
        ({"int": "1"}, "unknown structure node 'int'"),
        ({"dict": [], "list": []}, "a structure node must have one key"),
    ],
)
def test_malformed_structure_is_one_line(saved, tmp_path, params, message):
    _, header, arrays = saved["ts"]
    path = _write(tmp_path / "bad.npz", dict(header, params=params), arrays)
    text = _load_error(path)
    assert "is corrupt: its arrays do not match its header" in text and message in text


def test_deep_nesting_is_one_line(saved, tmp_path):
    _, header, arrays = saved["ts"]
    base = json.dumps(header)
    assert '"aux": {"none": true}' in base
    deep = base.replace(
        '"aux": {"none": true}', '"aux": ' + '{"list": [' * 5000 + "]}" * 5000
    )
    text = _load_error(_write(tmp_path / "deep.npz", None, arrays, header_text=deep))
    assert "has an unreadable __header__ entry" in text
    # Deep enough to parse but deeper than any calibrator's tree.
    nested = base.replace(
        '"aux": {"none": true}', '"aux": ' + '{"list": [' * 100 + "]}" * 100
    )
    text = _load_error(_write(tmp_path / "nest.npz", None, arrays, header_text=nested))
    assert "nested deeper than 32 levels" in text


def _with_array(saved, name, key, value):
    _, header, arrays = saved[name]
    return header, dict(arrays, **{key: value})


@pytest.mark.parametrize(
    "name, key, make, message",
    [
        # Bits of an int32 under a float32 header: was T = 2.8e-45.
        ("ts", "p0", lambda a: a.astype(np.int32) + 2, "stored as int32"),
        ("ts", "p0", lambda a: a.astype(np.float64), "stored as float64"),
        # A float64 vector was viewed as float32 of twice the length.
        ("vector", "p0", lambda a: a.astype(np.float64), "stored as float64"),
        ("vector", "p1", lambda a: a.astype(np.uint32), "stored as uint32"),
    ],
)
@pytest.mark.long
def test_stored_dtype_other_than_the_header_is_rejected(
    saved, tmp_path, name, key, make, message
):
    header, arrays = _with_array(saved, name, key, make(saved[name][2][key]))
    text = _load_error(_write(tmp_path / "dtype.npz", header, arrays))
    assert f"array entry '{key}' is {message}, but the header says float32" in text


def test_header_dtype_other_than_the_stored_one_is_rejected(saved, tmp_path):
    _, header, arrays = saved["ts"]
    params = json.loads(json.dumps(header["params"]))
    params["dict"][0][1]["dtype"] = "int32"
    text = _load_error(_write(tmp_path / "h.npz", dict(header, params=params), arrays))
    assert "array entry 'p0' is stored as float32, but the header says int32" in text


@pytest.mark.parametrize("value", [0.0, -0.3, np.nan, np.inf])
def test_temperature_outside_its_range_is_rejected(saved, tmp_path, value):
    header, arrays = _with_array(saved, "ts", "p0", np.asarray(value, np.float32))
    text = _load_error(_write(tmp_path / "t.npz", header, arrays))
    assert "bad parameters for calibration map 'ts'" in text
    assert "params['temperature'] must be finite and > 0, got" in text


@pytest.mark.parametrize(
    "name, key, change, message",
    [
        (
            "cts",
            "p0",
            lambda a: a * np.array([1, -1, 1, 1], a.dtype),
            "must be finite and > 0",
        ),
        ("vector", "p1", lambda a: a * np.nan, "params['w'] must be finite, got nan"),
        (
            "ets",
            "p1",
            lambda a: a * 0.5,
            "params['weights'] must sum to 1, got sum 0.5",
        ),
        ("ets", "p1", lambda a: a - 1, "params['weights'] must be in [0, 1]"),
    ],
)
@pytest.mark.long
def test_other_parameters_outside_their_range_are_rejected(
    saved, tmp_path, name, key, change, message
):
    header, arrays = _with_array(saved, name, key, change(saved[name][2][key]))
    text = _load_error(_write(tmp_path / "p.npz", header, arrays))
    assert message in text


@pytest.mark.parametrize(
    "apply, name, message",
    [
        (
            "vector",
            "vector",
            "params must be a dict with keys ['b', 'w'], got ['temperature']",
        ),
        ("dirichlet", "dirichlet", "params must be a dict with keys ['W', 'b']"),
        (
            "isotonic(top_label)",
            "isotonic",
            "params must be a dict with keys ['x', 'y']",
        ),
        ("cts", "cts", "params must be a dict with keys ['temperatures']"),
        (
            "ts",
            "dirichlet",
            "calibrator name 'dirichlet' does not fit its calibration map 'ts'",
        ),
        ("ts", "isotonic(one_vs_rest)", "does not fit its calibration map 'ts'"),
    ],
)
def test_map_or_name_that_does_not_fit_the_params_is_rejected(
    saved, tmp_path, apply, name, message
):
    _, header, arrays = saved["ts"]
    path = _write(tmp_path / "m.npz", dict(header, apply=apply, name=name), arrays)
    assert message in _load_error(path)


@pytest.mark.parametrize(
    "leaf, message",
    [
        ({"float": 1.5}, "params['temperature'] must be an array, got float"),
        ({"int": 2}, "params['temperature'] must be an array, got int"),
        ({"str": "hot"}, "params['temperature'] must be an array, got str"),
        ({"none": True}, "params['temperature'] must be an array, got NoneType"),
    ],
)
def test_python_leaves_and_renamed_keys_are_rejected(saved, tmp_path, leaf, message):
    _, header, arrays = saved["ts"]
    params = {"dict": [["temperature", leaf]]}
    path = _write(tmp_path / "s.npz", dict(header, params=params), arrays)
    assert message in _load_error(path)
    renamed = json.loads(json.dumps(header["params"]))
    renamed["dict"][0][0] = "temp"
    path = _write(tmp_path / "r.npz", dict(header, params=renamed), arrays)
    assert "params must be a dict with keys ['temperature'], got ['temp']" in (
        _load_error(path)
    )


def test_inconsistent_number_of_classes_is_rejected(saved, tmp_path):
    header, arrays = _with_array(saved, "vector", "p0", np.zeros(3, np.float32))
    text = _load_error(_write(tmp_path / "k.npz", header, arrays))
    assert "one entry per class for K >= 2 classes alike" in text


# ---------------------------------------------------------------------------
# Calibrator.apply on logits of another K
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["vector", "matrix", "dirichlet", "cts", "histogram_binning", "isotonic"]
)
@pytest.mark.long
def test_apply_names_the_expected_number_of_classes(name):
    cal = posthoc.fit(name, Z, Y)
    message = (
        f"calibrator '{cal.name}' was fitted for K = 4 classes: logits must have "
        "shape [N, 4], got shape (200, 5)"
    )
    wrong = np.concatenate([Z, Z[:, :1]], axis=1)
    with pytest.raises(ValueError) as err:
        cal.apply(wrong)
    assert str(err.value) == message + "."
    with pytest.raises(ValueError, match=r"fitted for K = 4 classes"):
        jax.jit(lambda c, z: c.apply(z))(cal, wrong)
    assert cal.apply(Z).shape == (200, 4)


@pytest.mark.long
@pytest.mark.parametrize("name", ["ts", "ets", "pts"])
def test_maps_that_take_any_k_still_do(name):
    cal = posthoc.fit(name, Z, Y, **({"steps": 30} if name == "pts" else {}))
    wide = np.concatenate([Z, Z], axis=1)
    out = np.asarray(cal.apply(wide))
    assert out.shape == (200, 8) and np.isfinite(out).all()


@pytest.mark.long
def test_vmapped_fits_still_apply_under_vmap():
    zs = np.stack([Z, Z[::-1]])
    ys = np.stack([Y, Y[::-1]])
    cals = jax.vmap(lambda z, y: posthoc.fit("vector", z, y))(zs, ys)
    out = jax.vmap(lambda c, z: c.apply(z))(cals, zs)
    assert out.shape == (2, 200, 4) and np.isfinite(np.asarray(out)).all()
