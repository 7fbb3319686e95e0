"""Simulated expert-offload engine (stdlib only)."""
