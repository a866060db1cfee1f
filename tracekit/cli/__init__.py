"""Command-line interface: ``app.py`` wires one module per verb."""
