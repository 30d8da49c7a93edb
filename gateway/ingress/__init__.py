"""Ingresses: each turns its protocol into an ExecContext and renders the outcome."""
