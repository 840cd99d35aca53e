"""Inputs and outputs of the core: the conversion-log contract, strict JSON, whole-or-absent files and
output folders, locks, Aggregation Service Avro, the parameter store and the release ledger's row sets.
Imports nothing else of araopt."""
