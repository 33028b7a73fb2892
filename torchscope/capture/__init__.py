"""Capture: turn a PyTorch training run into a run directory (Kineto traces + manifest).

Modules (each imports torch only where it needs it, so the CLI can import this package cheaply):

* :mod:`~torchscope.capture.profiler`   -- :class:`Profiler`, the ``torchscope.profile()`` context manager
* :mod:`~torchscope.capture.rundir`     -- where the run directory goes, rank/world size from the environment
* :mod:`~torchscope.capture.environment` -- CPUs and threads, recorded in the manifest
* :mod:`~torchscope.capture.tracewriter` -- the ``on_trace_ready`` writer (tensorboard_trace_handler layout)
* :mod:`~torchscope.capture.phases`     -- global hooks: phase labels and phase-boundary events
* :mod:`~torchscope.capture.steps`      -- step detection for unmodified scripts
* :mod:`~torchscope.capture.signals`    -- SIGINT/SIGTERM handling around the profiler
* :mod:`~torchscope.capture.runner`     -- run a script or module like ``python`` would, under the profiler

The file names, the manifest and the capture options are the run-directory contract, :mod:`torchscope.rundir`.
"""
