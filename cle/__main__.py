"""``python -m cle``: the ``cle`` command line (see :mod:`cle.cli`)."""

import sys

from cle.cli import main

if __name__ == "__main__":
    sys.exit(main())
