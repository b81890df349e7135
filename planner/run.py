"""``python -m planner.run plan.json [--script train.py] [-- args]``: ``planner run``."""

import sys

from planner.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
