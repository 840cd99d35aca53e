"""Choosing parameters: mergeable sufficient statistics, the error model (Thm. 4.2, Relaxation 4.5),
ParameterOptimization (Alg. 5) with the paper's and the corrected objectives, the baselines and the
tuning decisions."""
