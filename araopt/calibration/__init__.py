"""Calibration from history: retention ratios of fixed parameters, their fit, the model file, the
corrected estimates of the true totals and the replay of releases on the history's days."""

from araopt.calibration.accumulator import (
    CalibrationAccumulator,
    CalibrationStatistics,
    CandidatesCombiner,
    accumulate_candidates,
    add_conversions,
    calibration_statistics,
    candidates_statistics,
    compact,
    create_accumulator,
    day_blocks,
    extract_output,
    history_blocks,
    merge_accumulators,
    retained_values,
)
from araopt.calibration.backtest import Backtest, backtest
from araopt.calibration.calendar import Calendar, CalendarAdjustment, fit_calendar, parse_special_days
from araopt.calibration.correct import CorrectedEstimates, convolved_loss_quantiles, correct, period_blocks_for
from araopt.calibration.fit import calibrate, fit_calibration, shrink
from araopt.calibration.model import (
    CALIBRATION_FORMAT,
    KAPPA_PSEUDO_CONVERSIONS,
    METHOD,
    MIN_RATIO,
    Calibration,
    retention_checksum,
)

__all__ = [
    "Backtest", "CALIBRATION_FORMAT", "Calendar", "CalendarAdjustment", "Calibration", "CalibrationAccumulator",
    "CalibrationStatistics", "CandidatesCombiner", "CorrectedEstimates", "KAPPA_PSEUDO_CONVERSIONS", "METHOD",
    "MIN_RATIO", "accumulate_candidates", "add_conversions", "backtest", "calibrate", "calibration_statistics",
    "candidates_statistics", "compact", "convolved_loss_quantiles", "correct", "create_accumulator", "day_blocks",
    "extract_output",
    "fit_calendar", "fit_calibration", "history_blocks", "merge_accumulators", "parse_special_days",
    "period_blocks_for", "retained_values", "retention_checksum", "shrink",
]
