"""Diagnose stage: rules, each declared as data (id, category, threshold, fixes) beside the small function
that reads the Report's typed measurements (`rule.py`, `rules_*.py`), turned into ranked findings by
`engine.diagnose`."""
