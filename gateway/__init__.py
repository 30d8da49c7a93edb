"""execgate: a policy-enforcing gateway for AI-generated code execution."""

__version__ = "0.1.0"
