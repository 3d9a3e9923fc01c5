"""Post-hoc benchmark: temperature-fit time per objective vs scipy, the
class-wise loss scaling on a long-tailed synthetic set, conformal prediction
sets against a sort, and the histogram binning and isotonic-regression fits
vs NumPy and scikit-learn.

Run from the repository root::

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/posthoc.py          # writes RESULTS.md
    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/posthoc.py --quick  # small sizes, no write
    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/posthoc.py --only conformal
    .venv/bin/python benchmarks/posthoc.py --only nonparametric       # that part only

``--only temperature`` runs the first two parts; the nonparametric section of
RESULTS.md is named after the JAX backend, so CPU and accelerator runs are
both kept.

Timing: ``fit_temperature`` under ``jax.jit`` after one compile call, median
of several calls (``_timing.median_seconds``); the reference is
``scipy.optimize.minimize_scalar`` (bounded, on :math:`\\log T \\in
[\\log 0.05, \\log 20]`, default tolerance) on a NumPy float32 NLL with
``scipy.special.logsumexp``, timed in the same run. Logits are 3x the
calibrated logits of a synthetic set, so every objective should find
:math:`T \\approx 3`.

``--only eager`` writes "Post-hoc: eager fit('ts') vs jax.jit": the
temperature-scaling calibrator fitted as users call it (eagerly, its input
checks and fit warnings included) next to the same call under ``jax.jit``,
interleaved rounds of one run, and the first call's cost per shape (compile
included; wall and process-CPU seconds).

Conformal prediction sets (``--only conformal``) and histogram binning
against plain references (``--only hb_reference``): eager ``conformal.fit`` +
``predict_sets`` and eager ``posthoc.fit_histogram_binning`` at (N, K) =
(1e5, 10) and (1e6, 10) against the same procedures in single-threaded NumPy
(``numpy_conformal``, ``numpy_sorted_hb``), interleaved rounds of one run;
the second also times the equal-mass cut's radix select (CPU drop-in)
against its plain sort-and-cut form.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import logsumexp, softmax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import machine_line, median_seconds, write_section

from calib_jax import conformal, posthoc

OBJECTIVES = ("nll", "sb_ece", "hb_ece", "ece_grid")
SIZES = ((10_000, 10), (50_000, 100), (50_000, 1000))
COMMAND = "JAX_PLATFORMS=cpu .venv/bin/python benchmarks/posthoc.py"
REFERENCE_SIZES = ((100_000, 10), (1_000_000, 10))
CONFORMAL_ALPHA = 0.1


def overconfident(n, k, seed, scale=3.0):
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((n, k), dtype=np.float32) * np.float32(1.5)
    u = rng.random((n, k), dtype=np.float32)
    y = np.argmax(g - np.log(-np.log(np.clip(u, 1e-30, 1 - 1e-7))), axis=1)
    return (np.float32(scale) * g).astype(np.float32), y.astype(np.int32)


def scipy_ts(z, y):
    """Bounded Brent search of the numpy NLL over log T; returns (T, nfev)."""
    zy = z[np.arange(len(y)), y]

    def nll(u):
        s = np.float32(np.exp(-u))
        return float(np.mean(logsumexp(z * s, axis=1) - zy * s))

    res = minimize_scalar(nll, bounds=(np.log(0.05), np.log(20.0)), method="bounded")
    return float(np.exp(res.x)), int(res.nfev)


def time_fits(sizes, repeats):
    rows = []
    for n, k in sizes:
        z, y = overconfident(n, k, seed=0)
        zj, yj = jnp.asarray(z), jnp.asarray(y)
        row = {"size": (n, k)}
        for objective in OBJECTIVES:
            fit = jax.jit(
                lambda a, b, o=objective: posthoc.fit_temperature(a, b, objective=o)
            )
            t = float(fit(zj, yj))
            sec = median_seconds(
                lambda f=fit, a=zj, b=yj: jax.block_until_ready(f(a, b)),
                repeats=repeats,
                min_time=0.0,
            )
            row[objective] = (sec, t)
        start = time.perf_counter()
        t_ref, nfev = scipy_ts(z, y)
        once = time.perf_counter() - start
        sec = once
        if once < 5.0:
            sec = median_seconds(
                lambda a=z, b=y: scipy_ts(a, b), repeats=3, min_time=0.0
            )
        row["scipy"] = (sec, t_ref, nfev)
        row["per_eval"] = per_evaluation_seconds(zj, yj)
        rows.append(row)
        print(row, flush=True)
    return rows


def per_evaluation_seconds(z, y):
    """Value-and-gradient time in log T: the fused NLL, the fit's SB-ECE
    objective (blocked confidences + soft binning) and ``losses.sb_ece`` on
    the scaled logits (what the SB-ECE fit evaluated before)."""
    from calib_jax.losses._soft_ece import sb_ece
    from calib_jax.posthoc._temperature import nll_objective, sb_ece_objective

    nll = nll_objective(z, y, jnp.full(y.shape, 1.0 / y.shape[0], z.dtype))
    sb_fused = sb_ece_objective(
        z, y, None, num_bins=15, temperature=0.01, p=2.0, kind="lb"
    )
    zc = z - jnp.max(z, axis=1, keepdims=True)
    out = {}
    u0 = jnp.float32(-1.0)  # T = e: a typical point on the optimisation path

    def sb_loss(u):
        return sb_ece(zc * jnp.exp(-u), y)

    for name, fn in (("nll", nll), ("sb_ece", sb_fused), ("sb_ece_loss", sb_loss)):
        vg = jax.jit(jax.value_and_grad(fn))
        out[name] = median_seconds(
            lambda g=vg: jax.block_until_ready(g(u0)), repeats=5, min_time=0.0
        )
    return out


def long_tailed(seed, k=10, n0=1000, rho=0.01, scale=3.0, balanced=None):
    """Same generator as tests/posthoc/_data.py (App. C of Jung et al.)."""
    rng = np.random.default_rng(seed)
    prior = np.floor(n0 * rho ** (np.arange(k) / (k - 1))).astype(int)
    counts = prior if balanced is None else np.full(k, int(balanced))
    labels = np.repeat(np.arange(k), counts).astype(np.int32)
    g = rng.normal(size=(labels.size, k))
    g[np.arange(labels.size), labels] += np.linspace(2.5, 0.5, k)[labels]
    g += 0.5 * np.log(prior / n0)[None, :]
    return (scale * g).astype(np.float32), labels


def class_loss_std(cal, z, y, k):
    out = np.asarray(jax.nn.log_softmax(cal.apply(z)), np.float64)
    per = -out[np.arange(len(y)), y]
    return float(np.std([per[y == c].mean() for c in range(k)]))


def classwise_rows():
    from calib_jax import metrics

    k = 10
    zv, yv = long_tailed(0, k)
    zt, yt = long_tailed(1, k, balanced=300)
    rows = []
    for base in ("ts", "ets", "pts", "cts"):
        for name in (base, f"{base}+classwise"):
            cal = posthoc.fit(name, zv, yv)
            probs = cal.probs(zt)
            rows.append(
                {
                    "method": name,
                    "val_std": class_loss_std(cal, zv, yv, k),
                    "test_std": class_loss_std(cal, zt, yt, k),
                    "ece": float(metrics.ece(probs, yt)),
                    "acc": float(metrics.accuracy(probs, yt)),
                    "alpha": None if cal.aux is None else cal.aux["alpha"],
                    "beta": None if cal.aux is None else cal.aux["beta"],
                }
            )
            print(rows[-1], flush=True)
    return rows, (len(yv), len(yt))


def render(rows, cw_rows, cw_sizes, load):
    out = [
        (
            f"Machine: {machine_line()}; load average at start {load:.1f} "
            "(the 2 cores are shared with other jobs: absolute times are noisy, "
            "ratios within a row are measured in the same run)."
        ),
        f"Command: `{COMMAND}`",
        "",
        (
            "Temperature-fit time after compile (median seconds; fitted T in "
            "brackets; logits = 3 x calibrated logits). `scipy` = "
            "`minimize_scalar(method='bounded')` on the NumPy float32 NLL "
            "(function evaluations in brackets)."
        ),
        "",
        (
            "| N x K | nll | sb_ece | hb_ece | ece_grid | scipy NLL | "
            "scipy / nll | sb_ece / nll | SB-ECE / NLL per evaluation (loss) |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        n, k = r["size"]
        cells = [f"{r[o][0]:.4f} ({r[o][1]:.3f})" for o in OBJECTIVES]
        sec, t_ref, nfev = r["scipy"]
        pe = r["per_eval"]
        out.append(
            f"| {n} x {k} | "
            + " | ".join(cells)
            + f" | {sec:.3f} ({t_ref:.3f}, {nfev}) | {sec / r['nll'][0]:.1f}x | "
            f"{r['sb_ece'][0] / r['nll'][0]:.1f}x | "
            f"{pe['sb_ece'] / pe['nll']:.1f}x ({pe['sb_ece_loss'] / pe['nll']:.1f}x) |"
        )
    big = rows[-1]
    speedup = big["scipy"][0] / big["nll"][0]
    sb_ratio = big["sb_ece"][0] / big["nll"][0]
    n, k = big["size"]
    out += [
        "",
        (
            f"Targets at {n} x {k}: 'nll' >= 5x faster than scipy: "
            f"{speedup:.1f}x ({'met' if speedup >= 5 else 'NOT met'}); "
            f"'sb_ece' within 3x of 'nll': {sb_ratio:.1f}x "
            f"({'met' if sb_ratio <= 3 else 'NOT met'})."
        ),
        (
            "'sb_ece' runs the 'nll' fit (its starting point) and then L-BFGS "
            "on SB-ECE, so it costs the NLL fit's evaluations plus its own "
            "(L-BFGS iterations of both stages have about one value-and-"
            "gradient evaluation each). Each SB-ECE evaluation is one fused, "
            "row-blocked "
            "pass over the logits for the top-label confidences and their "
            "derivative in log T (the same pass as the NLL's), plus O(N M) "
            "soft binning of the [N] confidences. The last column is the cost "
            "of one value-and-gradient evaluation of that objective over one "
            "of the fused NLL; in brackets, that of `calib_jax.losses.sb_ece` "
            "on the scaled [N, K] logits (same value and gradient), which the "
            "fit evaluated before."
        ),
        "",
        (
            "Class-wise loss scaling on the long-tailed synthetic set "
            f"(`tests/posthoc/_data.py`: K = 10, {cw_sizes[0]} validation "
            "samples, 1000 to 10 per class, Eq. (16) of Jung et al. with "
            f"rho = 0.01; balanced test set of {cw_sizes[1]}): standard "
            "deviation of the class-wise mean NLLs, top-label ECE (15 "
            "equal-width bins, l1) and accuracy on the test set."
        ),
        "",
        (
            "| method | class-loss std (val) | class-loss std (test) | "
            "ECE (test) | accuracy (test) | alpha, beta |"
        ),
        "|---|---|---|---|---|---|",
    ]
    for r in cw_rows:
        ab = "-" if r["alpha"] is None else f"{r['alpha']:.3f}, {r['beta']:.3f}"
        out.append(
            f"| {r['method']} | {r['val_std']:.3f} | {r['test_std']:.3f} | "
            f"{r['ece']:.4f} | {r['acc']:.4f} | {ab} |"
        )
    return "\n".join(out) + "\n"


def interleaved_seconds(fns: dict, rounds: int) -> dict:
    """Median seconds of each blocking ``fn()``, timed in interleaved rounds.

    Every function is called once first (compile); then each round calls
    every function once in turn, so slow phases of a shared machine hit all
    of them alike.
    """
    for fn in fns.values():
        fn()
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return {name: float(np.median(v)) for name, v in samples.items()}


# ---------------------------------------------------------------------------
# Histogram binning and isotonic regression at (N, K) = (10^6, 10)
# ---------------------------------------------------------------------------

NONPARAMETRIC_SIZE = (1_000_000, 10)
NUM_BINS = 15
VARIANTS = ("top_label", "one_vs_rest")


def _binary_problems(z, y, variant):
    """NumPy: the (scores, targets) of each class of a reduction, float32."""
    p = softmax(z, axis=1).astype(np.float32)
    k = z.shape[1]
    if variant == "one_vs_rest":
        return [(np.ascontiguousarray(p[:, c]), y == c) for c in range(k)]
    pred = p.argmax(1)
    conf = p[np.arange(len(y)), pred]
    correct = pred == y
    order = np.argsort(pred.astype(np.uint8), kind="stable")
    counts = np.bincount(pred, minlength=k)
    ends = np.cumsum(counts)
    out = []
    for c in range(k):
        rows = order[ends[c] - counts[c] : ends[c]]
        out.append((conf[rows], correct[rows]))
    return out


def _library_problems(zj, y, variant):
    """The (scores, targets) of each class from the library's float32 scores
    (what ``posthoc.fit_isotonic`` fits), for the agreement check."""
    from calib_jax.posthoc import _reduction

    if variant == "one_vs_rest":
        p = np.asarray(_reduction.probabilities(zj))
        return [(p[:, c], y == c) for c in range(p.shape[1])]
    pred, conf = (np.asarray(a) for a in _reduction.top_label(zj))
    k = int(zj.shape[1])
    return [(conf[pred == c], (y == c)[pred == c]) for c in range(k)]


def numpy_histogram_binning(z, y, variant, num_bins=NUM_BINS, problems=None):
    """Equal-mass histogram binning with NumPy, the same bins as
    ``posthoc.fit_histogram_binning``: thresholds by ``np.partition`` (the
    order statistics at the group ends), bins by ``np.searchsorted``,
    frequencies by ``np.bincount``. Returns ``[K, M]`` bin frequencies.
    ``problems`` replaces the NumPy scores (for the agreement check)."""
    values = []
    for v, t in problems or _binary_problems(z, y, variant):
        n = v.size
        q, rem = divmod(n, num_bins)
        j = np.arange(1, num_bins)
        start = np.where(j <= rem, j * (q + 1), rem * (q + 1) + (j - rem) * q)
        thr = np.partition(v, start - 1)[start - 1]
        bins = np.searchsorted(thr, v, side="left")
        count = np.bincount(bins, minlength=num_bins)
        hits = np.bincount(bins, weights=t, minlength=num_bins)
        values.append(hits / np.maximum(count, 1))
    return np.stack(values)


def numpy_softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def numpy_conformal(method, zc, yc, zt, alpha=CONFORMAL_ALPHA, lam=0.1, k_reg=1):
    """Split-conformal THR/APS/RAPS in single-threaded NumPy, the algorithm of
    torchcp's ``THR``/``APS``/``RAPS`` scores with its ``SplitPredictor``
    (non-randomised: the mass up to and including the class), written plainly.
    Returns ``(qhat, sets)``."""
    pc, pt = numpy_softmax(zc), numpy_softmax(zt)

    def ranked(p):  # classes by decreasing probability, their scores
        order = np.argsort(-p, axis=1, kind="stable")
        s = np.cumsum(np.take_along_axis(p, order, axis=1), axis=1)
        if method == "raps":
            s += lam * np.maximum(np.arange(1, p.shape[1] + 1) - k_reg, 0)
        return order, s

    n = len(yc)
    if method == "thr":
        scores = 1.0 - pc[np.arange(n), yc]
    else:
        order, s = ranked(pc)
        scores = s[np.arange(n), np.argmax(order == yc[:, None], axis=1)]
    r = int(np.ceil((n + 1) * (1 - alpha)))
    qhat = np.partition(scores, r - 1)[r - 1]
    if method == "thr":
        return qhat, 1.0 - pt <= qhat
    order, s = ranked(pt)
    sets = np.zeros(pt.shape, bool)
    np.put_along_axis(sets, order, s <= qhat, axis=1)
    return qhat, sets


def conformal_rows(sizes, rounds):
    """Eager ``conformal.fit`` + ``predict_sets`` vs :func:`numpy_conformal`."""
    rows = []
    for n, k in sizes:
        z, y = overconfident(n, k, seed=0)
        half = n // 2
        zc, yc, zt = (jax.device_put(a) for a in (z[:half], y[:half], z[half:]))
        for name in conformal.PREDICTORS:
            pred = conformal.fit(name, zc, yc, alpha=CONFORMAL_ALPHA)
            sets = np.asarray(pred.predict_sets(zt))
            qhat, ref = numpy_conformal(name, z[:half], y[:half], z[half:])
            fns = {
                "calib_jax": lambda m=name: jax.block_until_ready(
                    conformal.fit(m, zc, yc, alpha=CONFORMAL_ALPHA).predict_sets(zt)
                ),
                "numpy": lambda m=name: numpy_conformal(
                    m, z[:half], y[:half], z[half:]
                ),
            }
            sec = interleaved_seconds(fns, rounds)
            rows.append(
                {
                    "size": (n, k),
                    "method": name,
                    **sec,
                    "qhat_diff": abs(float(pred.qhat) - float(qhat)),
                    "set_diff": float(np.mean(sets != ref)),
                    "coverage": float(np.mean(sets[np.arange(n - half), y[half:]])),
                }
            )
            print(rows[-1], flush=True)
    return rows


def _numpy_target(rows) -> str:
    """The verdict line of a calib_jax-vs-NumPy table (target: ratio <= 1)."""
    worst = max(r["calib_jax"] / r["numpy"] for r in rows)
    return (
        f"Target calib_jax / NumPy <= 1.0 in every cell: worst {worst:.2f}x "
        f"({'met' if worst <= 1.0 else 'NOT met'})."
    )


def render_conformal(rows, rounds, load):
    out = [
        f"Machine: {machine_line()}; load average at start {load:.1f} (the 2 "
        "cores are shared with other jobs: ratios are measured in the same run, "
        "in interleaved rounds).",
        f"Command: `{COMMAND} --only conformal`",
        "",
        "Split-conformal prediction sets as a user calls them, eagerly: "
        "`conformal.fit(method, z[:N/2], y[:N/2], alpha=0.1)` then "
        "`predict_sets(z[N/2:])` (input checks included), against the same "
        "procedure in single-threaded NumPy (`numpy_conformal`: softmax, "
        "torchcp's THR/APS/RAPS scores, non-randomised, RAPS lam = 0.1, "
        "k_reg = 1, the ceil((n+1)(1-alpha))-th smallest score by "
        "`np.partition`, sets by `put_along_axis`). torchcp itself needs torch, "
        "which cannot be installed here; the NumPy code is its algorithm. "
        f"Median seconds of {rounds} interleaved rounds after a warm-up call; "
        "logits 3 x the calibrated logits of a synthetic set. Last columns: "
        "|qhat difference|, fraction of set entries that differ (rounding of "
        "the cumulative sums at the threshold), coverage.",
        "",
        "| (N, K) | method | calib_jax s | NumPy s | calib_jax / NumPy | "
        "qhat diff | sets differ | coverage |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        n, k = r["size"]
        out.append(
            f"| ({n:,}, {k}) | {r['method']} | {r['calib_jax']:.4f} | "
            f"{r['numpy']:.4f} | {r['calib_jax'] / r['numpy']:.2f}x | "
            f"{r['qhat_diff']:.1e} | {r['set_diff']:.1e} | {r['coverage']:.4f} |"
        )
    out += [
        "",
        _numpy_target(rows),
        "",
        CONFORMAL_NOTES,
    ]
    return "\n".join(out) + "\n"


CONFORMAL_NOTES = """\
Where the time went (issue 21: 1.9x-2.9x slower than torchcp): the quantile was
a `jnp.sort` of the n calibration scores (about 30 ms at n = 5e4 on XLA:CPU,
where `np.partition` takes 0.4 ms); it is now found by bisection over the
float32 order (32 counts of the scores), exact and one of the scores. APS
and RAPS rank each row once in `fit` and once in `predict_sets`; XLA:CPU's
row sort costs about 1 us per entry on rows of 10 (56 ms at 5e4 x 10), so on
the CPU a sorting network of K <= 32 columns (family `conformal_row_sort`,
`conformal._cpu_kernels.sort_desc`: 8.6 ms, 6.5x) gives the same values.
Above 32 classes the plain sort runs. THR needs no row sort."""


def numpy_sorted_hb(z, y, variant, num_bins=NUM_BINS):
    """Equal-mass histogram binning in NumPy by sort and cut: each class's
    scores sorted, thresholds at the group ends, counts and positives up to
    each threshold by ``searchsorted``. Returns ``(thresholds, values)``."""
    p = numpy_softmax(z)
    n, k = p.shape
    if variant == "top_label":
        pred = p.argmax(1)
        v, t = p[np.arange(n), pred], pred == y
        problems = [(v[pred == c], t[pred == c]) for c in range(k)]
    else:
        problems = [(pc, y == c) for c, pc in enumerate(np.ascontiguousarray(p.T))]
    thresholds, values = [], []
    for v, t in problems:
        s, pos = np.sort(v), np.sort(v[t])
        q, rem = divmod(s.size, num_bins)
        j = np.arange(1, num_bins)
        cut = np.where(j <= rem, j * (q + 1), rem * (q + 1) + (j - rem) * q)
        thr = s[np.maximum(cut - 1, 0)]
        count = np.diff(np.r_[0, np.searchsorted(s, thr, "right"), s.size])
        hits = np.diff(np.r_[0, np.searchsorted(pos, thr, "right"), pos.size])
        thresholds.append(thr)
        values.append(hits / np.maximum(count, 1))
    return np.stack(thresholds), np.stack(values)


def hb_reference_rows(sizes, rounds):
    """Eager ``fit_histogram_binning`` vs :func:`numpy_sorted_hb`."""
    rows = []
    for n, k in sizes:
        z, y = overconfident(n, k, seed=0)
        zj, yj = jax.device_put(z), jax.device_put(y)
        for variant in VARIANTS:
            ours = posthoc.fit_histogram_binning(zj, yj, variant=variant)
            thr, val = numpy_sorted_hb(z, y, variant)
            fns = {
                "calib_jax": lambda v=variant: jax.block_until_ready(
                    posthoc.fit_histogram_binning(zj, yj, variant=v)
                ),
                "numpy": lambda v=variant: numpy_sorted_hb(z, y, v),
            }
            sec = interleaved_seconds(fns, rounds)
            rows.append(
                {
                    "size": (n, k),
                    "variant": variant,
                    **sec,
                    "thr_diff": float(
                        np.max(np.abs(np.asarray(ours["thresholds"]) - thr))
                    ),
                    "val_diff": float(np.max(np.abs(np.asarray(ours["values"]) - val))),
                }
            )
            print(rows[-1], flush=True)
    return rows


def order_statistics_rows(sizes, rounds):
    """The equal-mass cut (``_reduction.grouped_cut``) of top-label and
    one-vs-rest scores, jitted, tuned (radix select) vs plain (sort)."""
    import functools

    from calib_jax import kernels
    from calib_jax.posthoc import _reduction

    rows = []
    for n, k, variants in sizes:
        z, _ = overconfident(n, k, seed=0)
        zj = jax.device_put(z)
        pred, conf = _reduction.top_label(zj)
        for variant in variants:
            if variant == "top_label":
                v, group, top = conf, pred, k
            else:
                v = _reduction.probabilities(zj).reshape(-1)
                group, top = jnp.tile(jnp.arange(k, dtype=jnp.int32), n), 0
            ranks = functools.partial(
                _reduction.cut_ranks, num_bins=NUM_BINS, midpoint=False
            )
            cut = functools.partial(
                _reduction.grouped_cut, num_groups=k, ranks=ranks, top_label_of=top
            )
            fns = {}
            for mode in ("tuned", "plain"):
                with kernels.use(mode, "posthoc_order_statistics"):
                    f = jax.jit(cut).lower(v, group).compile()
                fns[mode] = lambda f=f: jax.block_until_ready(f(v, group))
            a, b = fns["tuned"](), fns["plain"]()
            same = all(bool(jnp.array_equal(x, y)) for x, y in zip(a, b))
            sec = interleaved_seconds(fns, rounds)
            rows.append({"size": (n, k), "variant": variant, **sec, "same": same})
            print(rows[-1], flush=True)
    return rows


HB_NOTES = """\
Notes: the differences to NumPy come from the scores (NumPy's float32 softmax
rounds differently from the library's, so a few rows change bins), not from
the cut. Top-label at (100,000, 1000) is where the radix select loses to the
sort (0.8x in the first run: 1000 classes x 14 ranks make 14,000 slots, four
8-bit passes); the family is chosen per platform, not per shape, and the
(1e5, 10) and (1e6, 10) cells users run most favour it 8x-44x."""


def render_hb_reference(rows, os_rows, rounds, load):
    out = [
        f"Machine: {machine_line()}; load average at start {load:.1f} (ratios "
        "from interleaved rounds of the same run).",
        f"Command: `{COMMAND} --only hb_reference`",
        "",
        "`posthoc.fit_histogram_binning(z, y, variant=...)` as a user calls it "
        f"(eager, {NUM_BINS} equal-mass bins, input checks and the fit warning "
        "included) against `numpy_sorted_hb`, 20 lines of NumPy that fit the "
        "same bins by sort and cut (softmax, `np.sort` of each class's scores, "
        "thresholds at the group ends, counts by `np.searchsorted`). Median "
        f"seconds of {rounds} interleaved rounds after a warm-up call. Last "
        "column: largest difference of the thresholds and of the bin values.",
        "",
        "| (N, K) | reduction | calib_jax s | NumPy s | calib_jax / NumPy | "
        "max diff (thresholds, values) |",
        "|---|---|---:|---:|---:|---|",
    ]
    for r in rows:
        n, k = r["size"]
        out.append(
            f"| ({n:,}, {k}) | {r['variant']} | {r['calib_jax']:.4f} | "
            f"{r['numpy']:.4f} | {r['calib_jax'] / r['numpy']:.2f}x | "
            f"{r['thr_diff']:.1e}, {r['val_diff']:.1e} |"
        )
    out += [
        "",
        _numpy_target(rows),
        "",
        "Plain first: the equal-mass cut `_reduction.grouped_cut` is a sort of "
        "the (class, score) pairs cut at the wanted ranks (it cannot mistake a "
        "discarded row for a kept one); its CPU drop-in "
        "`posthoc._cpu_kernels.grouped_cut` is the radix select (family "
        "`posthoc_order_statistics`). Both jitted, interleaved, same inputs "
        "(`same`: identical outputs):",
        "",
        "| (N, K) | scores | radix select ms | sort and cut ms | speed-up | same |",
        "|---|---|---:|---:|---:|---|",
    ]
    for r in os_rows:
        n, k = r["size"]
        out.append(
            f"| ({n:,}, {k}) | {r['variant']} | {1e3 * r['tuned']:.2f} | "
            f"{1e3 * r['plain']:.2f} | {r['plain'] / r['tuned']:.1f}x | {r['same']} |"
        )
    best = max(r["plain"] / r["tuned"] for r in os_rows)
    out += [
        "",
        f"Best speed-up {best:.1f}x: the radix select "
        f"{'stays as the CPU drop-in' if best >= 1.5 else 'is under the 1.5x bar'}"
        " (on GPU and TPU the plain sort runs; not measured there). One-vs-rest "
        "at (100,000, 1000) is left out: its plain form sorts 1e8 pairs, minutes "
        "on this CPU.",
        "",
        HB_NOTES,
    ]
    return "\n".join(out) + "\n"


def sklearn_isotonic(z, y, variant):
    """One ``IsotonicRegression(out_of_bounds='clip')`` per class, on float64
    scores (given float32 scores, scikit-learn pools scores closer than the
    float32 resolution, 1e-6, and fits something else)."""
    from sklearn.isotonic import IsotonicRegression

    return [
        IsotonicRegression(out_of_bounds="clip").fit(v.astype(np.float64), t)
        for v, t in _binary_problems(z, y, variant)
    ]


def _agreement(zj, z, y, variant):
    """Largest differences of the fitted values: HB bin frequencies vs NumPy;
    isotonic values at the knots vs scikit-learn on the library's scores."""
    from sklearn.isotonic import IsotonicRegression

    ours = posthoc.fit_histogram_binning(zj, y, variant=variant, num_bins=NUM_BINS)
    theirs = numpy_histogram_binning(
        z, y, variant, problems=_library_problems(zj, y, variant)
    )
    hb_diff = float(np.max(np.abs(theirs - np.asarray(ours["values"]))))
    iso = posthoc.fit_isotonic(zj, y, variant=variant)
    iso_diff = 0.0
    for c, (v, t) in enumerate(_library_problems(zj, y, variant)):
        model = IsotonicRegression(out_of_bounds="clip").fit(v.astype(np.float64), t)
        m = model.X_thresholds_.size
        fitted = np.asarray(iso["y"][c][:m], np.float64)
        iso_diff = max(iso_diff, float(np.max(np.abs(model.y_thresholds_ - fitted))))
    return hb_diff, iso_diff


def nonparametric_rows(size, rounds):
    import warnings

    n, k = size
    z, y = overconfident(n, k, seed=0)
    zj, yj = jax.device_put(z), jax.device_put(y)
    rows = []
    with warnings.catch_warnings():  # sane data: a fit warning is a bug
        warnings.simplefilter("error", posthoc.SuspiciousFitWarning)
        for variant in VARIANTS:
            fns = {
                "hb": lambda v=variant: jax.block_until_ready(
                    posthoc.fit_histogram_binning(zj, yj, variant=v, num_bins=NUM_BINS)
                ),
                "numpy_hb": lambda v=variant: numpy_histogram_binning(z, y, v),
                "isotonic": lambda v=variant: jax.block_until_ready(
                    posthoc.fit_isotonic(zj, yj, variant=v)
                ),
                "sklearn": lambda v=variant: sklearn_isotonic(z, y, v),
            }
            sec = interleaved_seconds(fns, rounds)
            hb_diff, iso_diff = _agreement(zj, z, y, variant)
            rows.append(
                {"variant": variant, **sec, "hb_diff": hb_diff, "iso_diff": iso_diff}
            )
            print(rows[-1], flush=True)
    return rows


def render_nonparametric(rows, size, load_start, load_end, rounds):
    n, k = size
    machine = (
        f"Machine: {machine_line()}. 1-minute load average {load_start:.1f} at the "
        f"start and {load_end:.1f} at the end (above the core count means other "
        "jobs shared the CPU; every column is measured in the same interleaved "
        "rounds, so the ratios are less affected than the times)."
    )
    command = (
        "Command: `.venv/bin/python benchmarks/posthoc.py --only nonparametric` "
        "(with JAX_PLATFORMS=cpu for the CPU backend)."
    )
    what = (
        f"Fit time from logits, (N, K) = ({n:,}, {k}), median of {rounds} "
        "interleaved rounds after one warm-up call, seconds. Both sides start "
        "from the same float32 logits and compute the probabilities. calib_jax: "
        f"`posthoc.fit_histogram_binning` ({NUM_BINS} equal-mass bins per class; "
        "jitted, exact order statistics by radix select, no sort) and "
        "`posthoc.fit_isotonic` (scores and packed uint32 keys by JAX; the keys "
        "sorted on the accelerator, or by NumPy on the CPU backend; ties pooled "
        "and SciPy's compiled PAV on the host). NumPy histogram binning: the same "
        "bins (`np.partition` at the group ends, `np.searchsorted`, "
        "`np.bincount`). scikit-learn: one "
        "`IsotonicRegression(out_of_bounds='clip').fit` per class of the same "
        "reduction (top-label: the rows predicted as the class; one-vs-rest: "
        "every row), on float64 scores (on float32 ones it pools scores closer "
        "than 1e-6 and fits something else). Input validation and the fit warnings are part of the "
        "calib_jax times. Last column: the largest difference of the fitted "
        "values, NumPy and scikit-learn fitted on the library's float32 scores "
        "(HB: bin frequencies; isotonic: values at the knots)."
    )
    header = (
        "| reduction | calib_jax HB | NumPy HB | NumPy / calib_jax | calib_jax "
        "isotonic | scikit-learn isotonic | scikit-learn / calib_jax | "
        "max abs diff (HB, isotonic) |"
    )
    out = [machine, "", command, "", what, "", header]
    out.append("|---|---:|---:|---:|---:|---:|---:|---|")
    ratios = []
    for r in rows:
        a, b = r["numpy_hb"] / r["hb"], r["sklearn"] / r["isotonic"]
        ratios += [a, b]
        out.append(
            f"| {r['variant']} | {r['hb']:.4f} | {r['numpy_hb']:.4f} | {a:.1f}x | "
            f"{r['isotonic']:.4f} | {r['sklearn']:.4f} | {b:.1f}x | "
            f"{r['hb_diff']:.1e}, {r['iso_diff']:.1e} |"
        )
    verdict = "met" if all(x >= 5 for x in ratios) else "NOT met"
    target = (
        "Target (>= 5x faster than NumPy / scikit-learn in every cell): "
        f"{verdict} (smallest ratio {min(ratios):.1f}x)."
    )
    notes = (
        "Where the time goes: histogram binning is three radix-select passes "
        "(one scatter-add each, over the N confidences for top-label and the "
        "N K probabilities for one-vs-rest) plus the binning; on XLA:CPU a "
        "scatter-add costs about what `np.bincount` does per element, so "
        "one-vs-rest is bound by those N K scatters. Isotonic regression is "
        "dominated by sorting the packed keys (NumPy's sort on the CPU backend) "
        "and moving them to the host; the PAV runs on the runs of equal "
        "targets, a small fraction of the points."
    )
    out += ["", target, "", notes]
    return "\n".join(out) + "\n"


EAGER_TARGET = 1.5
EAGER_NOTES = """\
Notes:

- One transfer per call: both columns include the caller's `float()` of the
  temperature. The eager fit fetches the temperature, the value summary and
  the warning's diagnostics in one `jax.device_get` (`_checks.fetch`); before,
  the summary, the accuracy, the tie flag, the simplex flag and the
  temperature were read on the host one by one: 6 round trips on a GPU by the
  count of `tests/test_transfers.py`.
- `fit('ts')` now checks shapes once in `fit` and values once, inside the
  fit's compiled call (rows screened by their sum, flagged rows re-checked
  exactly); before, the values were checked twice, each time with a row
  reduction over K.
- The fit warning's diagnostics are computed in the same compiled call:
  the validation accuracy from the fit's own row maxima (rows whose label
  logit is the maximum) plus one blocked pass at s = the largest float, whose
  `S_n` counts the entries at each row's maximum, so a label tied with another
  entry (where arg-max takes the first) sends that fit to the exact arg-max
  on the host. Before, the warning ran its own `jnp.argmax` over `[N, K]`
  (about 110 ms at (5e4, 1000), 5x the blocked pass) and a simplex check in
  two more programs: eager/jit was 1.58-1.74x and the first call compiled
  those programs as well (1.87-2.16 s on a loaded machine).
- `posthoc.fit` reuses the accuracy its inner fitter computed for the same
  input objects instead of computing it again.
- At (10,000, 10) the ratio is 1.26-1.40x over runs with these rounds
  (1.61x in a run of only 5 rounds): about 0.4 ms of host
  work (shape checks in `fit` and the fitter, fetching the summary, the
  warning's checks) on a fit of 1.3-2 ms. With 300 interleaved rounds on a
  quieter machine: 1.71 ms eager, 1.25 ms jitted (1.37x); the fused program
  itself takes 1.34 ms against the plain fit's 1.25 ms.
"""
COMPILE_TARGET = 1.5


def _first_call(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    jax.block_until_ready(fn())
    return time.perf_counter() - wall, time.process_time() - cpu


def _interleaved(fns, rounds):
    """Median seconds per call of each fn, timed round-robin (after a warm-up)."""
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())
            samples[name].append(time.perf_counter() - start)
    return {name: float(np.median(v)) for name, v in samples.items()}


def eager_vs_jit(sizes, rounds):
    """``posthoc.fit('ts', ...)`` eager vs jitted, and its first call per shape."""
    rows = []
    for n, k in sizes:
        z, y = overconfident(n, k, seed=0)
        z, y = jnp.asarray(z), jnp.asarray(y)

        # As users call it: the temperature read on the host (float()).
        def eager(z=z, y=y):
            return float(posthoc.fit("ts", z, y).params["temperature"])

        fit_jit = jax.jit(lambda z, y: posthoc.fit("ts", z, y).params)

        def jitted(z=z, y=y):
            return float(fit_jit(z, y)["temperature"])

        first = _first_call(eager)
        _first_call(jitted)
        fns = {"eager": eager, "jit": jitted}
        # Calls of a few ms need many rounds for a stable median.
        once = _first_call(eager)[0]
        times = _interleaved(fns, max(rounds, min(200, int(0.5 / once))))
        same = jax.tree_util.tree_all(
            jax.tree_util.tree_map(
                lambda a, b: np.asarray(a).tobytes() == np.asarray(b).tobytes(),
                eager(),
                fns["jit"](),
            )
        )
        rows.append(
            {
                "n": n,
                "k": k,
                "eager_ms": times["eager"] * 1e3,
                "jit_ms": times["jit"] * 1e3,
                "first_s": first[0],
                "first_cpu_s": first[1],
                "compile_s": first[0] - times["eager"],
                "same": same,
            }
        )
        print(rows[-1], flush=True)
    return rows


def eager_section(rows, load_start):
    lines, verdicts = [], []
    for r in rows:
        ratio = r["eager_ms"] / r["jit_ms"]
        lines.append(
            f"| {r['n']:,} | {r['k']} | {r['eager_ms']:.1f} | {r['jit_ms']:.1f} | "
            f"{ratio:.2f}x | {r['first_s']:.2f} | {r['first_cpu_s']:.2f} | "
            f"{r['compile_s']:.2f} | {r['same']} |"
        )
        verdicts.append(
            f"({r['n']:,}, {r['k']}): eager/jit {ratio:.2f}x "
            f"({'met' if ratio <= EAGER_TARGET else 'not met'}), compile "
            f"{r['compile_s']:.2f} s "
            f"({'met' if r['compile_s'] <= COMPILE_TARGET else 'not met'})"
        )
    return "\n".join(
        [
            f"Machine: {machine_line()}.",
            "",
            (
                f"Shared machine: 1-minute load average {load_start:.1f} at the "
                f"start and {os.getloadavg()[0]:.1f} at the end ({os.cpu_count()} "
                "cores; other sessions ran at the same time, which inflates "
                "absolute and compile times; the ratios come from one "
                "interleaved run)."
            ),
            "",
            f"Command: `{COMMAND} --only eager`",
            "",
            (
                "Eager = `float(posthoc.fit('ts', logits, labels).params"
                "['temperature'])` on concrete arrays (static checks; the NLL fit, "
                "the value summary and the warning's diagnostics in one program, "
                "fetched in one transfer; the fit warnings); jit = `float()` of "
                "`jax.jit` of the same call (shape checks only). "
                "Median per call over interleaved rounds (at least 5; about "
                "0.5 s of calls per function, at most 200). First call: the first "
                "eager call at that shape (tracing + compile + one fit); compile "
                "= first call minus the steady eager call. same bits: eager and "
                "jitted temperatures bit-identical."
            ),
            "",
            (
                "| N | K | eager ms | jit ms | eager / jit | first call s (wall) "
                "| first call CPU s | compile s | same bits |"
            ),
            "|---|---|---|---|---|---|---|---|---|",
            *lines,
            "",
            f"Targets (eager within {EAGER_TARGET}x of jit; first-call compile at "
            f"most {COMPILE_TARGET} s): " + "; ".join(verdicts) + ".",
            "",
            EAGER_NOTES,
        ]
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, no write")
    parser.add_argument(
        "--only",
        choices=("temperature", "conformal", "hb_reference", "nonparametric", "eager"),
        default=None,
        help="run (and write) only one part: the temperature/class-wise "
        "section, the conformal section or histogram binning and isotonic",
    )
    args = parser.parse_args()
    load = os.getloadavg()[0]
    if args.only == "eager":
        sizes = SIZES[:1] if args.quick else SIZES
        body = eager_section(eager_vs_jit(sizes, rounds=5), load)
        if not args.quick:
            write_section("Post-hoc: eager fit('ts') vs jax.jit", body)
        print(body)
        return
    if args.only in (None, "temperature"):
        sizes = ((2000, 10), (5000, 100)) if args.quick else SIZES
        rows = time_fits(sizes, repeats=3 if args.quick else 5)
        cw_rows, cw_sizes = classwise_rows()
        text = render(rows, cw_rows, cw_sizes, load)
        print(text)
        if not args.quick:
            write_section("Post-hoc", text)
    sizes = ((20_000, 10),) if args.quick else REFERENCE_SIZES
    if args.only in (None, "conformal"):
        rounds = 3
        text = render_conformal(conformal_rows(sizes, rounds), rounds, load)
        print(text)
        if not args.quick:
            write_section("Post-hoc: conformal prediction sets", text)
    if args.only in (None, "hb_reference"):
        rounds = 5
        os_sizes = [(n, k, VARIANTS) for n, k in sizes]
        if not args.quick:
            os_sizes.append((100_000, 1000, ("top_label",)))
        text = render_hb_reference(
            hb_reference_rows(sizes, rounds),
            order_statistics_rows(os_sizes, rounds),
            rounds,
            os.getloadavg()[0],
        )
        print(text)
        if not args.quick:
            write_section("Post-hoc: histogram binning vs NumPy sort and cut", text)
    if args.only in (None, "nonparametric"):
        load = os.getloadavg()[0]
        size = (20_000, 10) if args.quick else NONPARAMETRIC_SIZE
        rounds = 3 if args.quick else 5
        rows = nonparametric_rows(size, rounds)
        text = render_nonparametric(rows, size, load, os.getloadavg()[0], rounds)
        print(text)
        if not args.quick:
            title = (
                f"Post-hoc: histogram binning and isotonic ({jax.default_backend()})"
            )
            write_section(title, text)


if __name__ == "__main__":
    main()
