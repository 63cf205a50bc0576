"""python -m cgtree demo|info — see cgtree/demo.py."""
import sys

from .demo import main

sys.exit(main(sys.argv[1:]))
