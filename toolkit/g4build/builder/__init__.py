"""The build engine: a pure ``BuildPlan`` from pin + target, OS knowledge in one module per OS, executors."""
