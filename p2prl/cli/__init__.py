"""The ``p2prl`` command line (typer). Each module owns one command group and imports heavy parts lazily."""
