"""`python -m context_engine`: runs `python -m entrypoints`, the `context-engine` command
(entrypoints/__main__.py). A door that hands over by name: nothing of the kernel imports the
faces of the engine."""

import runpy

if __name__ == "__main__":
    runpy.run_module("entrypoints", run_name="__main__")
