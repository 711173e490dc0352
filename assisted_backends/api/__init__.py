"""The public entry points: `generate(...)` and the drop-in `enable(model)`."""
