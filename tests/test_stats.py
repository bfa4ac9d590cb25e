"""The statistics behind the verdicts: the crossed-effects interval against values worked out by
hand, Holm's correction, and the verdict rule's error rates on simulated studies."""

from __future__ import annotations

import math

import numpy as np
import pytest

from meml.reporting import stats
from meml.reporting.summary import Comparison, decide

SETTINGS = {"level": 0.95, "margin": 2.0, "floor": 2.0, "min_seeds": 2}


def test_crossed_effects_standard_error_by_hand() -> None:
    # S = 2 seeds, n = 3 questions. mean 3.5; seed means 2, 5; question means 2, 3, 5.5.
    # MS_seed = 3 * (1.5^2 + 1.5^2) / 1 = 13.5; MS_question = 2 * (1.5^2 + 0.5^2 + 2^2) / 2 = 6.5;
    # residuals +-0.5, +-0.5, -+1 -> SS 3 over (1 * 2) df: MS_e = 1.5.
    # Var(mean) = (13.5 + 6.5 - 1.5) / 6 = 3.08333; Satterthwaite df = 18.5^2 / (13.5^2/1 + 6.5^2/2 + 1.5^2/2)
    x = np.array([[1.0, 2.0, 3.0], [3.0, 4.0, 8.0]])
    est = stats.cell_estimate(x)
    assert est.mean == 3.5
    assert est.se == pytest.approx(math.sqrt(18.5 / 6), rel=1e-12)
    assert est.df == pytest.approx(18.5**2 / (13.5**2 + 6.5**2 / 2 + 1.5**2 / 2), rel=1e-12)


def test_a_component_below_the_residual_drops_out() -> None:
    # every seed the same on average (MS_seed = 0 < MS_e): Var = MS_question / (S n).
    # Columns 0, 2 -> question means 0 and 2, residuals +-1: MS_e = 4 / 1 = 4; MS_q = 2 * 2 / 1 = 4.
    # MS_q is not above MS_e either: Var = MS_e / (S n) = 4 / 4 = 1, df = df_e = 1.
    x = np.array([[1.0, 1.0], [-1.0, 3.0]])
    est = stats.cell_estimate(x)
    assert est.mean == 1.0 and est.se == pytest.approx(1.0) and est.df == 1.0


def test_one_seed_or_one_question_is_the_plain_t_interval() -> None:
    seeds = stats.cell_estimate(np.array([[10.0], [20.0], [30.0]]))  # one value per seed (final reward)
    assert (seeds.mean, seeds.df) == (20.0, 2.0) and seeds.se == pytest.approx(10 / math.sqrt(3))
    lo, hi = seeds.interval(0.95)
    assert hi - 20.0 == pytest.approx(4.302653 * 10 / math.sqrt(3), rel=1e-6)  # t(0.975, 2) = 4.302653
    assert lo == pytest.approx(40.0 - hi)
    assert not stats.cell_estimate(np.array([[5.0]])).has_interval


def test_identical_methods_give_a_zero_interval_and_p_one() -> None:
    est = stats.cell_estimate(np.zeros((3, 50)))
    assert est.se == 0.0 and est.p_value() == 1.0 and est.interval() == (0.0, 0.0)


def test_average_of_cells_adds_variances() -> None:
    a, b = stats.Estimate(10.0, 3.0, 4.0), stats.Estimate(20.0, 4.0, 8.0)
    avg = stats.average([a, b])
    # mean 15; Var = (9 + 16) / 4 = 6.25; df = 6.25^2 / ((2.25^2)/4 + (4^2)/8) = 39.0625 / 3.265625
    assert avg.mean == 15.0 and avg.se == pytest.approx(2.5)
    assert avg.df == pytest.approx(39.0625 / (2.25**2 / 4 + 4.0**2 / 8))


def test_holm_by_hand() -> None:
    # sorted 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04, but not below the step before: 0.06)
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def _comparison(est: stats.Estimate, claim: str = ">") -> Comparison:
    return Comparison("A beats B", "A", "B", claim, "main", est, (est, est))


def test_verdict_words_follow_the_adjusted_p() -> None:
    strong = _comparison(stats.Estimate(10.0, 2.0, 30.0))  # t = 5
    reverse = _comparison(stats.Estimate(-10.0, 2.0, 30.0))
    weak = _comparison(stats.Estimate(3.0, 2.0, 30.0))  # t = 1.5: inconclusive
    matches = _comparison(stats.Estimate(-0.5, 0.5, 30.0), ">=")  # 3 standard errors above -2
    floor = _comparison(stats.Estimate(0.0, 0.0, 30.0))
    floor.no_verdict = "at floor"
    decide([strong, reverse, weak, matches, floor], SETTINGS)
    assert strong.verdict == "supported" and reverse.verdict == "contradicted"
    assert matches.verdict == "supported"
    assert weak.verdict.startswith("inconclusive (this design detects about ±")
    # detectable at the strictest Holm level, 0.05 / 4 tests: (t(1 - 0.00625, 30) + t(0.8, 30)) * 2
    assert f"±{2 * (2.6682 + 0.8538):.1f} points" in weak.verdict
    assert floor.verdict == "no verdict (at floor)" and floor.p_adjusted is None


def _simulated_study(rng: np.random.Generator, seeds: int, questions: int, shift: float) -> stats.Estimate:
    """Two methods trained `seeds` times, evaluated on the same questions: logit = question difficulty
    + a per-run training effect (+ shift for method A); correct ~ Bernoulli. Two cells averaged."""
    cells = []
    for _ in range(2):
        difficulty = rng.normal(0.0, 1.2, questions)

        def run(delta: float, difficulty: np.ndarray = difficulty) -> np.ndarray:
            logit = difficulty[None, :] + rng.normal(0.0, 0.3, (seeds, 1)) + delta
            return (rng.random((seeds, questions)) < 1 / (1 + np.exp(-logit))).astype(float)

        cells.append(stats.cell_estimate(100 * (run(shift) - run(0.0))))
    return stats.average(cells)


def test_no_true_difference_gives_a_verdict_about_5_percent_of_the_time() -> None:
    rng = np.random.default_rng(20261201)
    studies = [_simulated_study(rng, 5, 500, 0.0) for _ in range(1000)]
    comparisons = [_comparison(e) for e in studies]
    for c in comparisons:  # each study on its own page: one test, Holm changes nothing
        decide([c], SETTINGS)
    false = sum(not c.verdict.startswith("inconclusive") for c in comparisons) / len(comparisons)
    print(f"\nnull: {false:.1%} of 1000 simulated studies (5 seeds x 500 questions x 2 cells) got a verdict")
    assert false <= 0.065  # 5% plus two Monte Carlo standard errors
    # ten null comparisons on one page: Holm keeps the chance of any verdict near 5% as well
    pages = [[_comparison(_simulated_study(rng, 5, 100, 0.0)) for _ in range(10)] for _ in range(200)]
    for page in pages:
        decide(page, SETTINGS)
    any_verdict = sum(any(not c.verdict.startswith("inconclusive") for c in page) for page in pages) / len(pages)
    print(f"null, 10 comparisons a page: {any_verdict:.1%} of 200 pages had any verdict")
    assert any_verdict <= 0.09


def test_a_true_difference_of_three_standard_errors_is_detected_most_of_the_time() -> None:
    rng = np.random.default_rng(7)
    sd = float(np.std([_simulated_study(rng, 5, 500, 0.0).mean for _ in range(300)]))
    # find the logit shift whose mean difference is three of those standard errors
    shift = 0.0
    while np.mean([_simulated_study(rng, 5, 500, shift).mean for _ in range(40)]) < 3 * sd:
        shift += 0.02
    comparisons = [_comparison(_simulated_study(rng, 5, 500, shift)) for _ in range(1000)]
    for c in comparisons:
        decide([c], SETTINGS)
    power = sum(c.verdict == "supported" for c in comparisons) / len(comparisons)
    print(f"\nalternative: a true difference of 3 SE ({3 * sd:.1f} points) supported in {power:.1%} of 1000 studies")
    assert power >= 0.6  # t with few seeds: about 70% here (a normal test would give 85%)
