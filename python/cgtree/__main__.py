"""python -m cgtree: the same program as the `cgtree` command (cli.py)."""
import sys

from .cli import main

sys.exit(main())
