"""W3C Attribution Level 1 (the successor of ARA): a model of the browser side of the spec
(``api.bs`` and its reference implementation ``impl/src/backend.ts`` at commit 9fab4e8).

* :mod:`.sites`: sites (registrable domains) as the API parses them;
* :mod:`.config`: the implementation-defined values (per-site budget, epoch, safety limits, caps);
* :mod:`.credit`: last-N-touch attribution with "fairly allocate credit";
* :mod:`.browser`: one browser instance: impression store, measureConversion, the privacy budget
  store (privacy unit: browser instance x conversion site x epoch), the safety limits, clearing;
* :mod:`.events`: event streams in the spec's end-to-end format, replayed through a browser.

The package sits beside :mod:`araopt.mechanism` (it may use its noise and randomness) and below the
optimizer, which chooses its parameters (per-query epsilon, maxValue, value scale, lookback).
"""
