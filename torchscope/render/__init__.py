"""Render stage: pure presentation of a Report (terminal, JSON, HTML). Renderers never compute analyses.

`render.registry.renderer(name)` gives a registered renderer; importing this package registers the
built-in ones."""

from torchscope.render import html, json, terminal  # noqa: F401  - each registers its renderer
