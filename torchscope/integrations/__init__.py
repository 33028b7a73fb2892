"""Training-framework integrations: a capture driven by the framework's own callbacks.

* :mod:`torchscope.integrations.lightning` -- ``TorchscopeCallback``, a Lightning ``Callback``
* :mod:`torchscope.integrations.hf`        -- ``TorchscopeCallback``, a Hugging Face ``TrainerCallback``

Each needs its framework (the ``lightning`` / ``hf`` extras; neither is a dependency of torchscope) and
says so in one line when it is missing. Both record what ``torchscope run`` records (one step per
optimizer step, the phase labels, closures handled) through :class:`torchscope.capture.profiler.Profiler`.
"""
