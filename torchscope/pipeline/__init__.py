"""Application layer: turns paths into Reports (discovery, caches, pools, progress, assembly, diagnosis).

Everything with I/O or orchestration lives here, above the pure layers (trace tables, analyses, rules)
and below the renderers and the CLI. `analyze()` is the entry point.
"""
