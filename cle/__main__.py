"""``python -m cle``: the ``cle`` command line (see :mod:`cle.cli`)."""

import sys

from cle._cli.main import main

if __name__ == "__main__":
    sys.exit(main())
