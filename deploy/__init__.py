"""Deployment assets: Dataflow Flex Templates, Cloud Scheduler, Cloud Composer (see deploy/README.md)."""
