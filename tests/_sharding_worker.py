"""One process of tests/test_sharding.py's 2-process placement.

``python _sharding_worker.py <process_id> <port> <out_dir>``: joins the
2-process CPU cluster on 127.0.0.1 (2 devices each), places the same host
logits and labels with ``sharding.shard_classes`` on a 1 x 4 mesh (the class
axis across both processes) and a 2 x 2 mesh (rows across the processes,
classes within), and writes ``<out_dir>/process-<i>.json``: whether each of
its devices holds the host array's block, the NLL of the placed logits, the
entries of a RAPS predictor's sets that differ from one device's sorted sets
away from a rounding band of ``qhat``, and the one-line error of a class axis
that does not divide ``K``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import numpy as np

N, K = 64, 32
LAM, K_REG = 0.02, 2


def case():
    """float32 logits of a classifier (a third of the rows confident enough
    for a softmax piled at 1.0) and labels; the same on every process."""
    rng = np.random.default_rng(9)
    z = 2.0 * rng.standard_normal((N, K))
    y = rng.integers(0, K, N)
    sure = rng.random(N) < 0.35
    z[sure, y[sure]] += rng.uniform(12.0, 30.0, sure.sum())
    return z.astype(np.float32), y.astype(np.int32)


def main(process: int, port: int, out: Path) -> None:
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process)
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from calib_jax import conformal, metrics
    from calib_jax.conformal import _mondrian
    from calib_jax.sharding import shard_classes

    z, y = case()
    local = jax.local_devices()[0]
    pred = conformal.fit(
        "raps", z[: N // 2], y[: N // 2], alpha=0.2, lam=LAM, k_reg=K_REG
    )
    held_z = z[N // 2 :]
    by_sort = np.asarray(pred.predict_sets(jax.device_put(held_z, local)))
    probs = jax.nn.softmax(jnp.asarray(held_z), axis=-1)
    each = np.asarray(
        _mondrian.class_scores(probs, None, pred.lam, method="raps", k_reg=K_REG)
    )
    near = np.abs(each - float(pred.qhat)) <= 1e-6 * max(1.0, float(pred.qhat))
    report = {}
    for name, (shape, data_axis) in {
        "1x4": ((1, 4), None),
        "2x2": ((2, 2), "data"),
    }.items():
        mesh = Mesh(np.array(jax.devices()).reshape(shape), ("data", "vocab"))
        zs, ys = shard_classes(z, y, mesh=mesh, data_axis=data_axis)
        blocks = all(
            np.array_equal(np.asarray(s.data), z[s.index])
            for s in zs.addressable_shards
        ) and all(
            np.array_equal(np.asarray(s.data), y[s.index])
            for s in ys.addressable_shards
        )
        nll = jax.jit(lambda a, b: metrics.nll(a, b, from_logits=True))(zs, ys)
        hz = shard_classes(held_z, mesh=mesh, data_axis=data_axis)
        sets = pred.predict_sets(hz)
        whole = jax.jit(lambda s: s, out_shardings=NamedSharding(mesh, P()))(sets)
        sets = np.asarray(whole.addressable_data(0))
        report[name] = {
            "processes": sorted({d.process_index for d in mesh.devices.flat}),
            "local_shards": len(zs.addressable_shards),
            "blocks": bool(blocks),
            "nll": float(nll),
            "mismatch_off_band": int(np.sum((sets != by_sort) & ~near)),
            "near": int(near.sum()),
            "size": float(sets.sum(1).mean()),
        }
        try:
            shard_classes(z[:, :31], y, mesh=mesh, data_axis=data_axis)
        except ValueError as err:
            report[name]["error"] = str(err)
    (out / f"process-{process}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
