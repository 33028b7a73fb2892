"""Build step for the one compiled part: torchscope.trace._fastscan (see docs/performance.md).

`optional=True`: where no C compiler is available the install still succeeds, and torchscope decodes every
batch with msgspec (slower, same results)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "torchscope.trace._fastscan",
            ["torchscope/trace/_fastscan.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-missing-field-initializers"],
            optional=True,
        )
    ]
)
