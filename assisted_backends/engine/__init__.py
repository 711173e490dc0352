"""The decoding engine: prefill -> [draft γ -> verify γ+1 -> accept -> commit/rollback]*, and what it touches.

Modules: `loop` (the loop), `round` (one round: `speculative_round(state, γ)`), `state` (`DecodingState`:
everything a call's rounds read and change, built once), `slots` (the batch's slots, one owner: each slot's
tokens, padding, caller row, limit, statistics and result), `drafter` (the `Drafter` protocol the
loop calls; `assisted_backends.drafters` implements it), `acceptance` (greedy prefix match, lossless rejection
sampling, `Verification`), `sampling` (processed scores, p and q), `stopping` (stop criteria on candidate
prefixes), `schedule` (how many tokens to draft), `stats`,
`realign` (batches), `kv_cache` (cache layouts and rollback), `cache_surgery` (rows and positions moved inside a
cache's tensors), `runner` (the `Runner` protocol the engine types against, and `ModelRunner`: one model and its
cache), `head_on_demand` (greedy verification computing the head only where it is read), `outputs` (the logits
behind committed tokens), `joins` (queues: a prompt takes the slot of a row that ended; the
refill after each round), `token_tree` (token trees).

The words (round, step, row, slot, column, position, committed, pending, γ, α, E) are those of
the glossary in docs/design.md.
"""
