"""Command-line entry points (``train.py`` / ``zoo-train``)."""
