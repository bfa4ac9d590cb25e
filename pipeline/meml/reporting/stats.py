"""Paired comparisons with confidence intervals, Holm's correction, and the smallest detectable
difference: the statistics behind every verdict of the report.

A comparison is method A minus method B on the same test questions and the same seeds. One cell
(one model on one data set) gives a matrix x[s, q] of paired differences, S seeds by n questions.
Two things vary in such a study: training (a seed trains a better or a worse model, which moves
every question of that seed) and the test sample (the n questions are a draw from the data set).
A t-interval over per-seed means sees only the first; a bootstrap over questions only the second.
We treat seed and question as crossed random effects (two-way ANOVA, one observation per cell):

    x[s, q] = mu + a_s + b_q + e_sq,    Var(mean of x) = s2_seed / S + s2_question / n + s2_e / (S n)

with Var(mean) estimated from the mean squares as (MS_seed + MS_question - MS_e) / (S n) and
Satterthwaite's degrees of freedom for the t quantile. The seed mean square always stays in, with its
few degrees of freedom, even when it falls below MS_e: with 2-3 seeds it has 1-2 df and falls there
by chance, and dropping it (setting the seed component to 0) then swaps a 1-df term for a many-df
one and narrows the interval; simulated, that rule gave a verdict in 10-13% of null studies at 2
seeds with a training effect (tests/test_stats.py prints the rates of both). Kept, it holds about
5% at 3 seeds but 6-8% at 2 seeds with a training effect, so the report gives no verdict
below 3 seeds (report.stats.min_seeds). The question
component is set to 0 when MS_question falls below MS_e (Var = MS_seed / (S n)), which errs wide.
With one seed the interval covers the test sample only; with one question per seed (a per-seed
quantity such as the final training reward) it is the t-interval over seeds. An average over
independent cells adds their variances (`average`); cells whose seed k starts from one shared
model (seed k's pretrained base, read by every data set's SFT) are not independent, and are
averaged seed by seed (`joint_average`). Where each seed draws a world of its own (grid.seeds_vary:
world), its test questions are its own: the questions are nested in the seeds, row s's question q
is not row t's, and the seed's mean carries its world, its training and its test draw at once.
Then (`nested`) Var(mean) = var_s(row means) / S on S - 1 df, the t-interval over seeds: a
question term of its own would count the test draw twice. Why not a bootstrap: with 5 seeds a resampling
interval is too narrow (it has 5 distinct seed sets to draw from), and this estimator is exact
enough to check by hand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps


@dataclass(frozen=True)
class Estimate:
    """A mean, its standard error and the degrees of freedom of its t quantile (df 0: no interval)."""

    mean: float
    se: float
    df: float

    @property
    def has_interval(self) -> bool:
        return self.df > 0 and math.isfinite(self.se)

    def interval(self, level: float = 0.95) -> tuple[float, float]:
        half = self.se * _t(1 - (1 - level) / 2, self.df)
        return self.mean - half, self.mean + half

    def rounded(self, level: float = 0.95, digits: int = 2) -> tuple[float | None, float | None, float | None]:
        """(mean, low, high) rounded for a JSON record; None where undefined (no interval, or no mean
        from too few values): JSON has no NaN."""

        def value(x: float | None) -> float | None:
            return round(x, digits) if x is not None and math.isfinite(x) else None

        low, high = self.interval(level) if self.has_interval else (None, None)
        return value(self.mean), value(low), value(high)

    def p_value(self, null: float = 0.0) -> float:
        """Two-sided p-value of `mean == null` (with se 0: 0 when the mean differs from it, else 1)."""
        if self.se == 0:
            return 1.0 if self.mean == null else 0.0
        return float(2 * sps.t.sf(abs(self.mean - null) / self.se, self.df))

    def detectable(self, alpha: float = 0.05, power: float = 0.8) -> float:
        """The smallest true difference a two-sided test at `alpha` finds with probability `power`."""
        return self.se * (_t(1 - alpha / 2, self.df) + _t(power, self.df))


def _t(p: float, df: float) -> float:
    return float(sps.t.ppf(p, max(df, 1.0)))


def cell_estimate(x: np.ndarray, nested: bool = False) -> Estimate:
    """The mean of an S x n matrix (seeds x questions) with the crossed-effects standard error, or
    with questions nested in the seeds (`nested`: each seed's own test questions) the t-interval
    over the seeds' means."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.size == 0:
        raise ValueError(f"expected a non-empty seeds x questions matrix, got shape {x.shape}")
    n_seeds, n_q = x.shape
    mean = float(x.mean())
    if n_seeds == 1 and n_q == 1:
        return Estimate(mean, math.nan, 0.0)
    if nested and n_seeds > 1:
        rows = x.mean(axis=1)
        return Estimate(mean, float(rows.std(ddof=1) / math.sqrt(n_seeds)), float(n_seeds - 1))
    if n_seeds == 1 or n_q == 1:  # one random effect: the plain t-interval over the other axis
        values = x.ravel()
        return Estimate(mean, float(values.std(ddof=1) / math.sqrt(values.size)), float(values.size - 1))
    df_s, df_q, df_e = n_seeds - 1, n_q - 1, (n_seeds - 1) * (n_q - 1)
    ms_s, ms_q, ms_e = _mean_squares(x)
    # E[MS_s] / (S n) = s2_seed / S + s2_e / (S n): the seed term, kept whatever its value. The
    # question term s2_question / n = (MS_q - MS_e) / (S n) is added when it is positive.
    parts = [(ms_s, df_s), (ms_q, df_q), (-ms_e, df_e)] if ms_q > ms_e else [(ms_s, df_s)]
    total = sum(v for v, _ in parts)
    se = math.sqrt(max(total, 0.0) / (n_seeds * n_q))
    return Estimate(mean, se, _satterthwaite(parts))


@dataclass(frozen=True)
class Components:
    """Where one method's (or one difference's) spread comes from, as standard deviations of one
    run's mean over the n test questions, in the units of x: `seed`, what retraining moves it
    (whichever stages grid.seeds_vary retrains); `test`, what another draw of n test questions
    would (question difficulty and the seed-by-question residual). Estimated from the mean squares
    of the S x n matrix (method of moments, a negative component read as 0). `seed_variance` is the
    seed component before that clipping, (MS_seed - MS_e) / n, negative when the seeds differ less
    than the residual would make them: differences of such estimates (stages.py) must not be biased
    by a clip on each side."""

    seed: float
    test: float
    seeds: int
    questions: int
    seed_variance: float


def components(x: np.ndarray, nested: bool = False) -> Components:
    """E[MS_seed] = n s2_seed + s2_e, E[MS_q] = S s2_q + s2_e, E[MS_e] = s2_e: seed sd
    sqrt(s2_seed), test sd sqrt((s2_q + s2_e) / n). Needs 2 or more seeds and questions. With the
    questions nested in the seeds (`nested`), one-way: E[MS_seed] = n s2_seed + s2_w, E[MS_w] =
    s2_w (the spread within a seed, the test draw's): seed sd sqrt(s2_seed), test sd sqrt(s2_w / n)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or min(x.shape) < 2:
        raise ValueError(f"variance components need 2 or more seeds and questions, got shape {x.shape}")
    n_seeds, n_q = x.shape
    if nested:
        rows = x.mean(axis=1)
        ms_s = n_q * float(rows.var(ddof=1))
        ms_w = float(((x - rows[:, None]) ** 2).sum()) / (n_seeds * (n_q - 1))
        s2_seed = (ms_s - ms_w) / n_q
        return Components(math.sqrt(max(0.0, s2_seed)), math.sqrt(ms_w / n_q), n_seeds, n_q, s2_seed)
    ms_s, ms_q, ms_e = _mean_squares(x)
    s2_seed = (ms_s - ms_e) / n_q
    s2_q = max(0.0, (ms_q - ms_e) / n_seeds)
    return Components(math.sqrt(max(0.0, s2_seed)), math.sqrt((s2_q + ms_e) / n_q), n_seeds, n_q, s2_seed)


def _mean_squares(x: np.ndarray) -> tuple[float, float, float]:
    """MS_seed, MS_question, MS_residual of an S x n matrix (two-way ANOVA, one observation a cell)."""
    n_seeds, n_q = x.shape
    mean, rows, cols = float(x.mean()), x.mean(axis=1), x.mean(axis=0)
    ms_s = n_q * float(((rows - mean) ** 2).sum()) / (n_seeds - 1)
    ms_q = n_seeds * float(((cols - mean) ** 2).sum()) / (n_q - 1)
    ms_e = float(((x - rows[:, None] - cols[None, :] + mean) ** 2).sum()) / ((n_seeds - 1) * (n_q - 1))
    return ms_s, ms_q, ms_e


def _satterthwaite(parts: Sequence[tuple[float, float]]) -> float:
    """Degrees of freedom of a sum of independent variance estimates (signed value, df)."""
    total = sum(v for v, _ in parts)
    denominator = sum(v * v / df for v, df in parts if df > 0)
    if total <= 0 or denominator <= 0:
        return float(min(df for _, df in parts))
    return max(1.0, total * total / denominator)


def welch(a: Sequence[float], b: Sequence[float]) -> Estimate:
    """mean(a) - mean(b) of two independent samples, with Welch's standard error and degrees of
    freedom (no interval when either has fewer than 2 values)."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    mean = float(x.mean() - y.mean())
    if x.size < 2 or y.size < 2:
        return Estimate(mean, math.nan, 0.0)
    vx, vy = float(x.var(ddof=1)) / x.size, float(y.var(ddof=1)) / y.size
    if vx + vy == 0:
        return Estimate(mean, 0.0, float(x.size + y.size - 2))
    return Estimate(mean, math.sqrt(vx + vy), _satterthwaite([(vx, x.size - 1), (vy, y.size - 1)]))


def average(estimates: Sequence[Estimate]) -> Estimate:
    """The mean of independent cells' estimates (each cell weighs the same)."""
    if not estimates:
        raise ValueError("nothing to average")
    k = len(estimates)
    mean = sum(e.mean for e in estimates) / k
    if not all(e.has_interval for e in estimates):
        return Estimate(mean, math.nan, 0.0)
    variances = [(e.se**2 / k**2, e.df) for e in estimates]
    return Estimate(mean, math.sqrt(sum(v for v, _ in variances)), _satterthwaite(variances))


def joint_average(matrices: Sequence[np.ndarray], nested: bool = False) -> Estimate:
    """The mean of K cells whose row s is the same seed s in every cell (seed s's runs share its
    pretrained base, so their errors are correlated across cells: adding the cells' variances would
    leave the covariance out). With y_s the seed's average over the cells' question means,

        Var(mean) = var_s(y_s) / S + sum_k s2_question_k / (n_k K^2),  s2_question_k = (MS_q - MS_e) / S

    var_s(y_s) holds the seed effects, their covariances across cells and the residuals; the
    questions, the same for every seed, move every y_s alike, so their part is added per cell where
    it is positive (as in cell_estimate). One cell is cell_estimate; one seed leaves nothing to
    correlate, so it is the independent `average`. Degrees of freedom: Satterthwaite. With the
    questions nested in the seeds (`nested`), var_s(y_s) / S alone on S - 1 df: y_s holds seed s's
    test draw too."""
    xs = [np.asarray(x, dtype=np.float64) for x in matrices]
    if not xs:
        raise ValueError("nothing to average")
    if any(x.ndim != 2 or x.size == 0 for x in xs) or len({x.shape[0] for x in xs}) != 1:
        raise ValueError(f"expected seeds x questions matrices with the same seeds, got {[x.shape for x in xs]}")
    if len(xs) == 1:
        return cell_estimate(xs[0], nested)
    n_seeds, k = xs[0].shape[0], len(xs)
    if n_seeds == 1:
        return average([cell_estimate(x) for x in xs])
    per_seed = np.mean([x.mean(axis=1) for x in xs], axis=0)  # y_s
    parts = [(float(per_seed.var(ddof=1)) / n_seeds, float(n_seeds - 1))]
    for x in xs if not nested else ():
        n_q = x.shape[1]
        if n_q < 2:
            continue
        _, ms_q, ms_e = _mean_squares(x)
        if ms_q > ms_e:
            scale = n_seeds * n_q * k * k
            parts += [(ms_q / scale, float(n_q - 1)), (-ms_e / scale, float((n_seeds - 1) * (n_q - 1)))]
    total = sum(v for v, _ in parts)
    return Estimate(float(per_seed.mean()), math.sqrt(max(total, 0.0)), _satterthwaite(parts))


@dataclass(frozen=True)
class Pooled:
    """Independent runs of one study combined with a random effect for the run (DerSimonian and
    Laird): `estimate` the pooled mean with its standard error and degrees of freedom; `tau` the
    between-run standard deviation beyond what each run's own interval allows (0 when the runs agree
    within their errors); `q` Cochran's heterogeneity statistic on runs - 1 df, `p_heterogeneity`
    its p-value, `i2` the share of the spread between runs that is heterogeneity."""

    estimate: Estimate
    tau: float
    q: float
    p_heterogeneity: float
    i2: float


def random_effects(estimates: Sequence[Estimate]) -> Pooled:
    """Pool K independent runs' estimates y_i (standard errors s_i):

        w_i = 1 / s_i^2,  Q = sum w_i (y_i - y_w)^2,  tau^2 = max(0, (Q - (K - 1)) / (sum w - sum w^2 / sum w))
        w*_i = 1 / (s_i^2 + tau^2),  mean = sum w*_i y_i / sum w*_i,  Var(mean) = 1 / sum w*_i

    Degrees of freedom by Satterthwaite over the parts of Var(mean): each run's own variance with
    its df, and tau^2 with K - 1. At two runs tau^2 rests on one degree of freedom: it is 0 unless
    the runs differ by more than their own errors (Q > 1), and when it is not its single df makes
    the pooled interval wide (t quantile 12.7 at 95%). That is the honest price of two runs: the
    pooled interval can only be as sure of the between-run spread as two draws allow."""
    if not estimates:
        raise ValueError("nothing to pool")
    k = len(estimates)
    if k == 1:
        return Pooled(estimates[0], 0.0, 0.0, 1.0, 0.0)
    means = [e.mean for e in estimates]
    if not all(e.has_interval for e in estimates):
        return Pooled(Estimate(sum(means) / k, math.nan, 0.0), math.nan, math.nan, math.nan, math.nan)
    if any(e.se == 0 for e in estimates):  # a run without error (a deterministic measure): no weights
        return Pooled(average(estimates), math.nan, math.nan, math.nan, math.nan)
    w = [1 / e.se**2 for e in estimates]
    fixed = sum(wi * y for wi, y in zip(w, means, strict=True)) / sum(w)
    q = sum(wi * (y - fixed) ** 2 for wi, y in zip(w, means, strict=True))
    tau2 = max(0.0, (q - (k - 1)) / (sum(w) - sum(wi * wi for wi in w) / sum(w)))
    w_star = [1 / (e.se**2 + tau2) for e in estimates]
    total = sum(w_star)
    mean = sum(wi * y for wi, y in zip(w_star, means, strict=True)) / total
    shares = [wi / total for wi in w_star]  # Var(mean) = sum shares^2 (s_i^2 + tau^2) = 1 / sum w*
    parts = [(a * a * e.se**2, e.df) for a, e in zip(shares, estimates, strict=True)]
    if tau2 > 0:
        parts.append((sum(a * a for a in shares) * tau2, float(k - 1)))
    estimate = Estimate(mean, math.sqrt(1 / total), _satterthwaite(parts))
    i2 = max(0.0, (q - (k - 1)) / q) if q > 0 else 0.0
    return Pooled(estimate, math.sqrt(tau2), q, float(sps.chi2.sf(q, k - 1)), i2)


def difference_z(a: Estimate, b: Estimate) -> float:
    """The z of two independent runs' difference: (a - b) / sqrt(se_a^2 + se_b^2) (with no error at
    all: 0 for equal means, infinite otherwise)."""
    scale = math.sqrt(a.se**2 + b.se**2)
    if scale == 0:
        return 0.0 if a.mean == b.mean else math.copysign(math.inf, a.mean - b.mean)
    return (a.mean - b.mean) / scale


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order (family-wise error at any level)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
