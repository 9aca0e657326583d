"""``python -m ropekit``: the same command line as the ``ropekit`` script."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
