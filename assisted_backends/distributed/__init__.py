"""Multi-rank launches: DeepSpeed tensor parallelism for the target, and the ranks' agreement on every decision."""
