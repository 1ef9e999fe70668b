"""`python -m context_engine.cli`, as children of an `up` started before the command line became a
package are started: the same entry point as `python -m context_engine`."""

from context_engine.__main__ import main

if __name__ == "__main__":
    main()
