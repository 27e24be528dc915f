"""Least-squares fits of the selector's constants from measured times (numpy only).

``python -m tilecomm.tune`` measures; this module turns its raw points into a
profile (docs/selector.md):

- per link class, alpha (s per message) and beta (s per byte) from one-way
  message times: ``t = alpha + beta * n``;
- per dtype, gamma (s per reduced byte) from local reductions: ``t = c + gamma * n``
  (the intercept ``c`` is the call's own overhead, not part of the model);
- per world size and algorithm, two scale factors on the model's terms, from
  the algorithm's measured times: ``t = corr_lat * latency + corr_bw * (bandwidth + reduction)``.

Every fit minimises the relative error (each point weighted by 1 / measured),
so small and large sizes count alike, and keeps the fitted values >= a bound.
Anything doubtful (too few points, a poor fit, a clamped value, a missing link
class or dtype) falls back or degrades with a ``FitWarning``; nothing here raises
on measured data.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from tilecomm import algorithms, selector

POOR_FIT = 0.5  # relative RMS error above which a fit is reported as poor
# A correction below this would make a term vanish outside the measured sizes. Not higher: the link's
# alpha comes from a point-to-point ping-pong, whose thread hand-offs can cost 10-30x a collective's
# round on a box with fewer cores than ranks (docs/selector.md), and latency corrections of 0.03-0.09
# were fitted there.
MIN_CORRECTION = 0.01
# The GPU models' fits (cuda_model, executor_model) do not take fitted constants whose tables choose
# worse on the very points they were fitted to than the current constants' do, by more than this
# much mean regret (a smaller difference is a choice or two among near-equal times): chooses_worse.
REGRET_SLACK = 0.005


def mean_regret(regrets: dict, memory: str) -> float | None:
    """The mean regret over a GPU model's ``regret`` dict ({(memory, ...): [(bytes, regret, ...)]}) at
    the keys of one peer memory; None where there is none."""
    rs = [e[1] for key, entries in regrets.items() if key[0] == memory for e in entries]
    return sum(rs) / len(rs) if rs else None


def chooses_worse(regret, records, memory: str, current: dict, fitted: dict, what: tuple[str, str]) -> str | None:
    """The warning to give where the constants `fitted` choose worse on `records` over `memory` than
    `current` by more than REGRET_SLACK of mean regret (``regret(records, constants)``: a GPU model's),
    else None. `what` names the section and what chooses, e.g. ("cuda_executor", "tables")."""
    # NOTE: least squares on the times is not least regret: a few constants shared by every kernel
    # or schedule can fit the times better and still rank two of them the wrong way round.
    now, then = mean_regret(regret(records, current), memory), mean_regret(regret(records, fitted), memory)
    if now is None or then is None or then <= now + REGRET_SLACK:
        return None
    section, chooser = what
    return (f"{section} {memory}: the fitted constants' {chooser} choose worse on these points (regret mean "
            f"{then:.3f} against {now:.3f} with the current constants); kept the current constants")


class FitWarning(UserWarning):
    """A fit fell back to defaults, was clamped, or fits its points poorly."""


def warn(msg: str):
    warnings.warn(msg, FitWarning, stacklevel=3)


def bounded_lstsq(A, y, lower) -> np.ndarray:
    """argmin ||A x - y||_2 subject to x >= lower, for a handful of unknowns.

    Exact: the optimum has some set of unknowns above their bounds and equals
    the unconstrained solution on that set, so every set is tried and the best
    feasible one kept.
    """
    A = np.asarray(A, dtype=float)
    y = np.asarray(y, dtype=float)
    lower = np.asarray(lower, dtype=float)
    k = A.shape[1]
    if k > 6:
        raise ValueError(f"bounded_lstsq is exhaustive; {k} unknowns is too many")
    rest = y - A @ lower
    scale = np.linalg.norm(A, axis=0)
    scale[scale == 0] = 1.0
    As = A / scale  # columns of one norm: sizes span many orders of magnitude
    best, best_cost = lower.copy(), float(rest @ rest)
    for size in range(1, k + 1):
        for free in combinations(range(k), size):
            cols = list(free)
            sol, *_ = np.linalg.lstsq(As[:, cols], rest, rcond=None)
            if np.any(sol < 0):
                continue
            x = lower.copy()
            x[cols] += sol / scale[cols]
            r = A @ x - y
            cost = float(r @ r)
            if cost < best_cost:
                best, best_cost = x, cost
    return best


def errors(predicted, measured) -> dict:
    """Relative errors |predicted - measured| / measured: count, median, worst, RMS."""
    p = np.asarray(predicted, dtype=float)
    m = np.asarray(measured, dtype=float)
    if m.size == 0:
        return {"points": 0, "median": None, "worst": None, "rms": None}
    e = np.abs(p - m) / m
    return {
        "points": int(m.size),
        "median": float(np.median(e)),
        "worst": float(e.max()),
        "rms": float(np.sqrt(np.mean(e * e))),
    }


def _valid(points, what, width=2):
    """Rows of `width` finite values, the last (a time) > 0 and the others >= 0; the rest are dropped with a warning."""
    rows = []
    for p in points:
        vals = [float(v) for v in p]
        if len(vals) != width or not all(math.isfinite(v) for v in vals):
            continue
        if any(v < 0 for v in vals[:-1]) or vals[-1] <= 0:
            continue
        rows.append(vals)
    if len(rows) < len(points):
        warn(
            f"{what}: dropped {len(points) - len(rows)} invalid point(s) (a time <= 0, a negative or non-finite value)"
        )
    return np.array(rows, dtype=float).reshape(-1, width)


@dataclass(frozen=True)
class AffineFit:
    """t = intercept + slope * n, fitted (or fallen back: fitted is False)."""

    intercept: float
    slope: float
    errors: dict
    fitted: bool


def fit_affine(points, what: str, fallback: tuple[float, float]) -> AffineFit:
    """Fits t = a + b * n, a, b >= 0, to [(n, t), ...]. Too few points: `fallback` (a, b), with a warning."""
    pts = _valid(points, what)
    n, t = pts[:, 0], pts[:, 1]
    if len(np.unique(n)) < 2:
        warn(f"{what}: {len(np.unique(n))} distinct size(s) measured, 2 needed; keeping {fallback}")
        a, b = fallback
        return AffineFit(a, b, errors(a + b * n, t), False)
    A = np.column_stack([np.ones_like(n), n]) / t[:, None]
    free, *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
    a, b = bounded_lstsq(A, np.ones_like(t), [0.0, 0.0])
    for name, value in zip(("per-call time", "per-byte time"), free):
        if value < 0:
            warn(f"{what}: the fitted {name} was negative ({value:.3g}); clamped to 0")
    err = errors(a + b * n, t)
    if err["rms"] > POOR_FIT:
        warn(
            f"{what}: poor fit (relative error median {err['median']:.0%}, worst {err['worst']:.0%}); "
            "the measurements are noisy (is the machine busy?)"
        )
    return AffineFit(float(a), float(b), err, True)


def fit_corrections(samples, what: str) -> tuple[dict, dict]:
    """Scale factors on the model's two parts, from [(latency_s, bandwidth_s, measured_s), ...].

    ``latency_s`` and ``bandwidth_s`` are the uncorrected model's latency term
    and its bandwidth plus reduction terms. Returns ({"latency": .., "bandwidth": ..},
    relative errors after correction). A part that is zero at every point (a
    barrier moves no bytes) keeps 1.0; with fewer points than parts to fit, or
    sizes that cannot tell the parts apart, both stay 1.0 (with a warning).
    Factors are kept >= MIN_CORRECTION.
    """
    pts = _valid(samples, what, width=3)
    A, t = pts[:, :2], pts[:, 2]
    active = [j for j in range(2) if np.any(A[:, j] > 0)]
    factors = np.ones(2)
    if not active or len(t) < len(active) or _rank(A[:, active] / t[:, None]) < len(active):
        warn(f"{what}: {len(t)} point(s) cannot determine {len(active)} correction(s); keeping 1.0")
        return {"latency": 1.0, "bandwidth": 1.0}, errors(A.sum(axis=1), t)
    Aw = A[:, active] / t[:, None]
    factors[active] = bounded_lstsq(Aw, np.ones_like(t), [MIN_CORRECTION] * len(active))
    free, *_ = np.linalg.lstsq(Aw, np.ones_like(t), rcond=None)
    for j, value in zip(active, free):
        if value < MIN_CORRECTION:
            part = ("latency", "bandwidth")[j]
            warn(f"{what}: the fitted {part} correction was {value:.3g}; kept at {MIN_CORRECTION}")
    err = errors(A @ factors, t)
    if err["rms"] > POOR_FIT:
        warn(f"{what}: poor fit after correction (relative error median {err['median']:.0%}, worst {err['worst']:.0%})")
    return {"latency": float(factors[0]), "bandwidth": float(factors[1])}, err


def _rank(M) -> int:
    """Numerical rank with unit columns, so parts of very different sizes are not mistaken for collinear."""
    return int(np.linalg.matrix_rank(M / np.linalg.norm(M, axis=0), tol=1e-9))


def fit_profile(points, fallback=selector.DEFAULT_PROFILE, name="tuned", fingerprint=None) -> dict:
    """A profile from tune's raw points (schema in docs/selector.md)::

        {"links": {"shm": [[bytes, one-way seconds], ...]},
         "reduce": {"float32": [[bytes, seconds], ...], ...},
         "dtype": "float32",  # of the collective times below
         "collectives": {"<world>": {"<algorithm id>": [[bytes, seconds], ...]}}}

    Link classes and dtypes without points keep `fallback`'s constants.
    """
    profile = {"version": selector.SCHEMA_VERSION, "name": name, "fingerprint": fingerprint or {}}
    residuals: dict = {"links": {}, "gamma": {}, "corrections": {}}

    links = {}
    measured_links = points.get("links", {})
    for link in sorted(set(fallback["links"]) | set(measured_links)):
        base = fallback["links"].get(link, fallback["links"][selector.LINK])
        if not measured_links.get(link):
            warn(f"link class {link!r}: no measurements; keeping the fallback's constants")
            links[link] = dict(base)
            continue
        f = fit_affine(measured_links[link], f"link {link}", (base["alpha_s"], base["beta_s_per_byte"]))
        links[link] = {"alpha_s": f.intercept, "beta_s_per_byte": f.slope}
        residuals["links"][link] = f.errors
    profile["links"] = links

    gammas = {}
    for dtype, pts in sorted(points.get("reduce", {}).items()):
        f = fit_affine(pts, f"gamma {dtype}", (0.0, selector.gamma(fallback, dtype)))
        gammas[dtype] = f.slope
        residuals["gamma"][dtype] = f.errors
    if selector.TABLE_DTYPE not in gammas:
        warn(f"gamma: no {selector.TABLE_DTYPE} measurements; keeping the fallback's")
        gammas[selector.TABLE_DTYPE] = selector.gamma(fallback, selector.TABLE_DTYPE)
    # Dtypes not measured get float32's: the closest guess for an element-wise loop.
    gammas["default"] = gammas[selector.TABLE_DTYPE]
    profile["gamma_s_per_byte"] = gammas
    profile["corrections"], residuals["corrections"] = _fit_all_corrections(points, profile)
    profile["residuals"] = residuals
    profile["points"] = points
    return profile


def _fit_all_corrections(points, profile):
    """Corrections per world and algorithm against `profile`'s constants (its corrections unused)."""
    corrections: dict = {}
    residuals: dict = {}
    dtype = points.get("dtype", selector.TABLE_DTYPE)
    registry = {a.name: a for a in algorithms.ALGORITHMS}
    for world, per_algo in sorted(points.get("collectives", {}).items(), key=lambda kv: int(kv[0])):
        for name, pts in sorted(per_algo.items()):
            if name not in registry:
                warn(f"world {world}: algorithm {name!r} is not registered; its points are ignored")
                continue
            t = selector.terms(registry[name], int(world))
            samples = []
            for nbytes, seconds in pts:
                pr = selector.predict(t, nbytes, profile, dtype=dtype)
                samples.append((pr.latency_s, pr.bandwidth_s + pr.reduction_s, seconds))
            before = errors([s[0] + s[1] for s in samples], [s[2] for s in samples])
            c, after = fit_corrections(samples, f"world {world} {name}")
            corrections.setdefault(world, {})[name] = c
            residuals.setdefault(world, {})[name] = {"before": before, "after": after}
    return corrections, residuals
