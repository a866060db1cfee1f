"""``python -m tracekit`` runs the command-line interface."""

from tracekit.cli.app import main

if __name__ == "__main__":
    main()
