"""Serve specviz on the embedded pair at http://127.0.0.1:7860 (the same as `specviz serve`)."""

import sys

from specviz.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
