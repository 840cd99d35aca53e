"""The browser side: ARA limits, key maps, source and trigger registrations, and reconstruction of
estimates from the Aggregation Service's summary reports."""
