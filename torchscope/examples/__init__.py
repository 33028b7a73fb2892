"""Bundled example workloads (no downloads): ``python -m torchscope.examples.demo_train``."""
