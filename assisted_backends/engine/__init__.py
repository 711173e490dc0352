"""The decoding engine: prefill -> [draft γ -> verify γ+1 -> accept -> commit/rollback]*, and what it touches.

Modules: `loop` (the loop), `acceptance` (greedy prefix match, lossless rejection sampling),
`sampling` (processed scores, p and q), `stopping` (stop criteria on candidate prefixes), `schedule`
(how many tokens to draft), `stats`, `tokens` (the token buffer), `realign` (batches), `kv_cache`
(cache layouts and rollback), `runner` (one model and its cache), `head_on_demand` (greedy verification
computing the head only where it is read), `outputs` (the logits behind committed tokens), `joins` (queues:
a prompt takes the slot of a row that ended).

Glossary (Leviathan et al. 2023 notation):
- γ: the number of draft tokens proposed in a round; verification scores γ + 1 positions.
- round: one target pass over the pending token and γ draft tokens; a *plain round* has γ = 0.
- α: acceptance rate, accepted / drafted; E: tokens per round, the target's own token included.
- committed tokens: tokens that are final; everything past the buffer's `length` is scratch.
- pending token: the newest committed token, not yet fed to a model; every pass starts with it.
- row: one sequence of the caller's batch (`caller_rows[b]` is the caller's index of batch position b).
- batch position: a row's index in the tensors now; rows that finish leave the batch (dynamic layout)
  or ride along (static shapes), so positions change while caller rows do not.
- filler row: a copy of row 0 added so that a static-shape batch is a power of two; never read.
- slot: a batch position of a queue, serving one prompt after another (`joins`).
- static shapes: prompts padded to a bucket multiple, caches preallocated, exactly γ drafted and γ + 1
  verified every round, the batch rounded up to a power of two: a bounded set of shapes (graphs on
  HPU and CUDA).
"""
