"""``python -m chunkstore``: the same command line as the ``chunkstore`` script."""

from chunkstore.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
