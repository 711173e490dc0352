"""`train-draft`: train an EAGLE-3 head for a target from local text or chat logs, on a CPU or a GPU.

The standard EAGLE recipe: the head learns to predict the target's next token from the target's features,
on the target's own greedy continuations (`data`) of prompts taken from the text (`corpus`) or of the user turns
of chat logs (`chat`, a ShareGPT-format JSON), unrolled as it drafts (training-time test, `ttt`), over a draft
vocabulary chosen from the target's own token frequencies (`vocab`). `trainer.train` runs it within a time
budget with checkpoints it resumes from; `cli` is the command.
"""
