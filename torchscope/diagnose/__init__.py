"""Diagnose stage: rules (small pure functions) turn a Report's measurements into ranked findings."""
