"""Evaluation of parameters on test data (analytic and Monte-Carlo RMSRE_tau, coverage, generalization
gap), the paper's metrics table and every figure."""
