"""Policy evaluation (docs/policy-evaluation.md): counterfactual replay of logged decisions
under a candidate configuration, and its estimators. Reads telemetry rows and re-runs the
pure routing core; the core does not know it exists."""
