"""TensorBoard event files of a training run equal its metrics.jsonl."""

from __future__ import annotations

import importlib.abc
import importlib.util
import io
import subprocess
import sys

import numpy as np
import pytest
from _events import event_files, read_events
from etils.epath import gpath
from PIL import Image

from calib_jax import tensorboard
from calib_jax.train.loop import train_and_evaluate
from calib_jax.train.metrics_log import load_jsonl
from configs import digits_ce


def _config(**log):
    c = digits_ce.get_config()
    c.unlock()
    c.num_steps, c.log_every, c.eval_every = 12, 4, 8
    c.checkpoint_every = 4
    c.shifts.corruptions, c.shifts.severities = "contrast", (2, 5)
    c.log.update(log)
    c.lock()
    return c


class _PoisonedTensorFlow(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes ``tensorflow`` findable, and records (and fails) any import of it.

    TensorFlow is not installed here, so ``'tensorflow' not in sys.modules``
    alone could not fail; with this finder, a writer that imports TensorFlow
    whenever it is available is caught.
    """

    def __init__(self):
        self.imported = []

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tensorflow":
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        self.imported.append(module.__name__)
        raise ImportError("tensorflow is poisoned in this test")


@pytest.mark.long
def test_event_scalars_equal_the_jsonl_and_the_diagram_is_an_image(
    tmp_path, monkeypatch
):
    workdir = tmp_path / "run"
    poison = _PoisonedTensorFlow()
    monkeypatch.setattr(sys, "meta_path", [poison, *sys.meta_path])
    # etils caches whether TensorFlow is findable; forget the poisoned answer.
    tf_cache = gpath._is_tf_installed.cache_clear
    tf_cache()
    try:
        summary = train_and_evaluate(_config(tensorboard=True), workdir, progress=False)
    finally:
        monkeypatch.undo()
        tf_cache()
    # tensorboardX wrote the events without TensorFlow, though it was findable.
    assert "tensorflow" not in sys.modules and poison.imported == []
    rows = load_jsonl(workdir / "metrics.jsonl")
    scalars, images = read_events(str(workdir / "tensorboard"))
    # Every JSONL value is in the event file at its step, equal in float32.
    expected = {}
    for row in rows:
        for key, value in row.items():
            if key not in ("step", "time"):
                expected[(key, row["step"])] = np.float32(value)
    assert scalars == expected
    steps = sorted({s for (k, s) in scalars if k == "loss/total"})
    assert steps == [4, 8, 12]
    for key in ("test/ece", "shift/contrast/5/ece", "shift/mean/ece"):
        assert scalars[(key, 12)] == np.float32(summary[key])
    assert ("test/ece", 8) in scalars  # the evaluation at eval_every
    # The final reliability diagram: a PNG of the size the event states.
    (key,) = images
    assert key == ("test/reliability", 12)
    h, w, png = images[key]
    pixels = np.asarray(Image.open(io.BytesIO(png)))
    assert pixels.shape[:2] == (h, w) and h > 100 and w > 100
    assert pixels.std() > 10  # a drawn figure, not a blank canvas

    # Resumed from step 8 (the last checkpoint lost): a second event file
    # purges steps >= 9 of the first, and the events equal the JSONL's latest
    # value of every key and step.
    (workdir / "checkpoints" / "12").rename(tmp_path / "ckpt12")
    train_and_evaluate(_config(tensorboard=True), workdir, progress=False)
    files = event_files(str(workdir / "tensorboard"))
    assert len(files) == 2
    latest = {}
    for row in load_jsonl(workdir / "metrics.jsonl"):
        for key, value in row.items():
            if key not in ("step", "time"):
                latest[(key, row["step"])] = np.float32(value)
    scalars, images = read_events(str(workdir / "tensorboard"))
    assert scalars == latest
    assert list(images) == [("test/reliability", 12)]


def test_unwritable_log_dir_fails_in_one_line_before_training(tmp_path):
    (tmp_path / "a_file").write_text("")
    bad = tmp_path / "a_file" / "tb"
    c = _config(tensorboard=True, tensorboard_dir=str(bad))
    with pytest.raises(ValueError) as err:
        train_and_evaluate(c, tmp_path / "run", progress=False)
    text = str(err.value)
    assert "\n" not in text
    assert f"TensorBoard log directory {bad} is not writable" in text
    assert not (tmp_path / "run").exists()  # nothing written, config.json neither


def test_writer_is_lazy_and_the_check_leaves_no_probe(tmp_path):
    tensorboard.check_writable(tmp_path / "new" / "tb")
    assert not (tmp_path / "new").exists()  # created, probed, removed
    (tmp_path / "tb").mkdir()
    tensorboard.check_writable(tmp_path / "tb")
    assert list((tmp_path / "tb").iterdir()) == []  # kept, probe removed
    with tensorboard.Writer(tmp_path / "tb"):
        pass
    assert event_files(str(tmp_path / "tb")) == []


def test_cli_unwritable_log_dir_is_one_line(tmp_path):
    from _cli import command, env

    (tmp_path / "f").write_text("")
    proc = subprocess.run(
        command(
            "digits_ce.py",
            tmp_path / "run",
            "--config.log.tensorboard=True",
            f"--config.log.tensorboard_dir={tmp_path / 'f' / 'tb'}",
        ),
        env=env(),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: TensorBoard log directory "), proc.stderr
    assert "is not writable" in lines[0]
    assert not (tmp_path / "run").exists()


def test_events_in_a_bucket_are_uploaded_whole(gcs_emulator, gcs_bucket):
    from _events import events_of, parse_records

    bucket = gcs_bucket[len("gs://") :]
    tensorboard.check_writable(f"{gcs_bucket}/run/tb")
    assert gcs_emulator.objects(bucket, "run/") == []  # the probe is removed
    writer = tensorboard.Writer(f"{gcs_bucket}/run/tb", upload_secs=0.0)
    writer.scalars(1, {"loss/total": 0.5, "test/ece": 0.125})
    (name,) = gcs_emulator.objects(bucket, "run/tb/")  # uploaded while writing
    writer.scalars(2, {"loss/total": 0.25})
    writer.add_image("img", 2, np.full((4, 6, 3), 200, np.uint8))
    writer.close()
    assert gcs_emulator.objects(bucket, "run/tb/") == [name]
    scalars, images = events_of([parse_records(gcs_emulator.read(bucket, name))])
    assert scalars == {
        ("loss/total", 1): np.float32(0.5),
        ("test/ece", 1): np.float32(0.125),
        ("loss/total", 2): np.float32(0.25),
    }
    assert list(images) == [("img", 2)] and images[("img", 2)][:2] == (4, 6)


def test_a_missing_bucket_is_one_line(gcs_emulator):
    with pytest.raises(ValueError) as err:
        tensorboard.check_writable("gs://no-such-bucket-calib/tb")
    assert "\n" not in str(err.value) and "gs://no-such-bucket-calib/tb" in str(
        err.value
    )
