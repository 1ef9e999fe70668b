"""`python -m context_engine`: the `context-engine` command (entrypoints/__main__.py). The door
only; nothing of the kernel imports the faces."""

from entrypoints.__main__ import main

if __name__ == "__main__":
    main()
