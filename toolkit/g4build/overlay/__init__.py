"""Route: lay patch series over a released wheel (or an installed venv) instead of building, and the registry
of released wheels it starts from."""
