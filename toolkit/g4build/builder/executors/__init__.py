"""Executors: run a ``BuildPlan`` here (``native``) or in a container (``docker``)."""
