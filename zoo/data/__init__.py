"""Synthetic verifiable tasks, row sources (tasks or JSONL files) and data utilities."""
