"""executions."""
