"""Trace stage: find Kineto trace files, parse them into columnar tables, cache the tables."""
