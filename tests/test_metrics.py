"""The paper's metrics table: Monte-Carlo metrics agree with their closed forms and definitions."""
import numpy as np
import pytest

from araopt.evaluation import metrics
from araopt.optimize.error_model import ErrorBreakdown

RNG = np.random.default_rng(21)


def samples(truth, bias, sd, runs=200_000):
    return truth + bias + sd * RNG.standard_normal((runs, len(truth)))


def test_rmse_rmsre_rmsre_tau_match_closed_forms():
    truth = np.array([0.0, 2.0, 50.0, 1000.0])
    bias = np.array([1.0, -0.5, 3.0, -20.0])
    sd = np.array([2.0, 1.0, 5.0, 30.0])
    s = samples(truth, bias, sd)
    b = ErrorBreakdown(truth=truth[:, None], expected=(truth + bias)[:, None], variance=(sd**2)[:, None])
    closed = metrics.rmse_closed_form(b)[:, 0]
    assert np.allclose(metrics.rmse(s, truth), closed, rtol=0.01)
    tau = 5.0
    assert np.allclose(metrics.rmsre_tau_samples(s, truth, tau), metrics.rmsre_tau_closed_form(b, np.array([tau]))[:, 0],
                       rtol=0.01)
    rel = metrics.rmsre(s, truth)
    assert np.isnan(rel[0]) and np.allclose(rel[1:], closed[1:] / truth[1:], rtol=0.01)
    assert np.isnan(metrics.rmsre_closed_form(b)[0, 0])


def test_probability_metrics_against_normal_cdf():
    from scipy import stats

    truth = np.array([10.0, 100.0])
    sd = np.array([2.0, 5.0])
    s = samples(truth, np.zeros(2), sd)
    # AME_tau = P(|U - V| > tau) = 2 (1 - Phi(tau / sd))
    assert np.allclose(metrics.ame(s, truth, 3.0), 2 * stats.norm.sf(3.0 / sd), atol=0.005)
    # ARE_alpha = P(|U - V| / V > alpha)
    assert np.allclose(metrics.are(s, truth, 0.1), 2 * stats.norm.sf(0.1 * truth / sd), atol=0.005)
    # APME = P(rel > alpha and abs > tau) = P(|e| > max(alpha V, tau))
    assert np.allclose(metrics.apme(s, truth, 0.1, 3.0), 2 * stats.norm.sf(np.maximum(0.1 * truth, 3.0) / sd), atol=0.005)
    # EARE = E|e| / V = sd sqrt(2/pi) / V ; EARE_tau uses max(tau, V)
    assert np.allclose(metrics.eare(s, truth), sd * np.sqrt(2 / np.pi) / truth, rtol=0.01)
    assert np.allclose(metrics.eare_tau(s, truth, 50.0), sd * np.sqrt(2 / np.pi) / np.maximum(50.0, truth), rtol=0.01)


def test_metrics_table_and_undefined_cases():
    truth = np.array([0.0, 20.0])
    s = samples(truth, np.zeros(2), np.array([1.0, 1.0]), runs=10_000)
    table = metrics.metrics_table(s, truth, alpha=0.1, tau=5.0)
    assert set(table) == {"ARE_0.1", "AME_5", "APME_0.1,5", "EARE", "RMSE", "RMSRE", "EARE_5", "EAREO", "RMSRE_5"}
    assert np.isnan(metrics.eare(s, truth)[0])  # undefined at zero (Table: "Defined at Zero")
    assert np.isfinite(table["RMSRE_5"]) and table["RMSRE_5"] > 0
    with pytest.raises(ValueError, match="samples"):
        metrics.rmse(np.zeros((3, 2)), np.zeros(3))
