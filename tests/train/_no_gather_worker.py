"""One process of tests/train/test_no_logit_gather.py's 2-process evaluation.

``python _no_gather_worker.py <process_id> <port> <out_dir>``: joins the
2-process CPU cluster on 127.0.0.1, scores the sets of
:func:`sets` (each process feeding only its half of every global batch) with
the trainer's scoring (``calib_jax.train.evaluate.collect_set``), exports its
shard of the logits to ``<out_dir>/logits`` and writes
``<out_dir>/process-<i>.json``: the metrics, and the shape of every array this
process passed to ``multihost_utils.process_allgather`` (recorded by a wrapper
installed before calib_jax is imported).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import jax
import numpy as np
from jax.experimental import multihost_utils

RECEIVED: list[list[int]] = []
_allgather = multihost_utils.process_allgather


def _recording(tree, tiled=False):
    RECEIVED.extend(list(np.shape(x)) for x in jax.tree.leaves(tree))
    return _allgather(tree, tiled=tiled)


multihost_utils.process_allgather = _recording

BATCH = 64
OOD_NAME = "mock_ood"


# Rows of val, test and the OOD set: 1,500 and 5,000 entries of 10 classes,
# on the two reduction paths of XLA:CPU (calib_jax.train.scoring.block_rows).
SIZES = (150, 500, 130)


def sets(sizes=SIZES) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{key: (logits float32 [N, K], labels int32 [N])}`` of ``val``,
    ``test`` and ``ood`` with ``sizes`` rows: logits as classifiers give them
    (top-label probabilities from ~0.3 to piled at 1.0 and just below it),
    the OOD set's labels -1."""
    rng = np.random.default_rng(24)
    out = {}
    for key, n in zip(("val", "test", "ood"), sizes):
        z = (2.0 * rng.normal(size=(n, 10))).astype(np.float32)
        top = rng.integers(0, 10, n)
        z[np.arange(n), top] += rng.choice([0.0, 2.0, 6.0, 17.0, 40.0], n)
        y = np.where(rng.random(n) < 0.8, top, rng.integers(0, 10, n))
        out[key] = (z, (y if key != "ood" else np.full(n, -1)).astype(np.int32))
    return out


def owned_rows(n: int, process: int, count: int) -> np.ndarray:
    """The rows of a set that ``calib_jax.data.pipeline.eval_batches`` gives
    process ``process``: its contiguous slice of every global batch."""
    local = BATCH // count
    starts = range(0, n, BATCH)
    rows = np.concatenate([s + process * local + np.arange(local) for s in starts])
    return rows[rows < n]


def main(process: int, port: int, out: Path) -> None:
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process)
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from calib_jax.train import evaluate

    mesh = Mesh(np.array(jax.devices()), ("data",))
    by_row = NamedSharding(mesh, P("data"))
    local = BATCH // jax.process_count()

    def batches(z, y):
        for b in range(math.ceil(len(y) / BATCH)):
            positions = b * BATCH + process * local + np.arange(local)
            mask = positions < len(y)
            image = np.zeros((local, z.shape[1]), np.float32)
            label = np.zeros(local, np.int32)
            image[mask], label[mask] = z[positions[mask]], y[positions[mask]]
            yield {
                name: jax.make_array_from_process_local_data(by_row, x)
                for name, x in (("image", image), ("label", label), ("mask", mask))
            }

    # The "model": the images are the logits.
    step = jax.jit(lambda state, images: images + 0.0)
    results = {
        key: evaluate.collect_set(
            step,
            None,
            batches(z, y),
            num_rows=len(y),
            split=key != evaluate.OOD_KEY,
            keep_logits=True,
        )
        for key, (z, y) in sets().items()
    }
    metrics = evaluate.score_sets(results)
    logits = {key: (r.logits, r.labels) for key, r in results.items()}
    extras = {key: {evaluate.ROW_INDEX: r.index} for key, r in results.items()}
    evaluate.export_logits(out / "logits", logits, OOD_NAME, extras=extras)
    report = {"metrics": metrics, "received": RECEIVED}
    (out / f"process-{process}.json").write_text(json.dumps(report))
    multihost_utils.sync_global_devices("done")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
