"""Renderers: each reads an `Analysis` (the model) and nothing else."""
