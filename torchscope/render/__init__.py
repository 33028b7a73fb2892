"""Render stage: pure presentation of a Report (terminal, JSON). Renderers never compute analyses."""
