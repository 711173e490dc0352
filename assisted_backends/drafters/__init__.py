"""Drafters: whatever proposes γ tokens for the target to verify (`base.Drafter`), built by `factory`."""
