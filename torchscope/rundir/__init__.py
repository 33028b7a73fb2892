"""The run-directory contract: what a capture writes and every reader expects, declared once.

The bottom layer: it imports nothing from torchscope but ``errors``, ``files`` and ``__version__``, and
never torch or numpy, so the capture (the writer), the loaders (the readers) and the CLI share it cheaply.

* :mod:`~torchscope.rundir.layout`   -- file and folder names of a run directory (docs/run-directory.md)
* :mod:`~torchscope.rundir.labels`   -- the range names the capture records and the analyses look for
* :mod:`~torchscope.rundir.config`   -- :class:`CaptureConfig`: the capture options and their defaults
* :mod:`~torchscope.rundir.manifest` -- the ``run.json`` manifest: one struct, its writer, a tolerant reader
"""
