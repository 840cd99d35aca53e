"""The ARA mechanism: the parameters of one configuration, aggregation keys, HistogramContribution
(Alg. 3, Alg. 6), ContributionCapping (Alg. 1), discrete Laplace noise, the per-key sums, the summary
report and its reconstruction (Alg. 2, Alg. 4), and the one release step. It knows nothing of how its
parameters were tuned or calibrated."""
