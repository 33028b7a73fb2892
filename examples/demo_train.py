"""The demo workload as a plain script: ``python examples/demo_train.py`` or ``torchscope run examples/demo_train.py``.

The workload itself lives in the package (``torchscope/examples/demo_train.py``) so that ``torchscope demo``
works after ``pip install``; this file only runs it.
"""

from torchscope.examples.demo_train import main

if __name__ == "__main__":
    main()
