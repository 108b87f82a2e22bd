"""``python -m paddle_amp_scaler``: the command line, in the ``cli`` package."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
