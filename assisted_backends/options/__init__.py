"""The options layer: every range check and precedence rule of a `generate` call, written once."""
