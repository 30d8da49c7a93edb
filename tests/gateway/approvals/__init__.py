"""approvals."""
