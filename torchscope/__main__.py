"""`python -m torchscope` -> the command-line interface."""

import sys

from torchscope.cli import main

if __name__ == "__main__":
    sys.exit(main())
