"""EAGLE-3 heads: a one-layer draft that reads the target's hidden states (`head`), its own KV cache
(`cache`), the hand-over of the target's features (`features`), the drafter in the one loop (`drafter`),
published checkpoints (`checkpoint`, `config`), the checks against a target (`build`) and the precision it
drafts in (`precision`)."""

from assisted_backends.drafters.eagle.checkpoint import is_eagle_checkpoint, load_head, save_head
from assisted_backends.drafters.eagle.config import Eagle3Config
from assisted_backends.drafters.eagle.head import Eagle3Head
from assisted_backends.drafters.eagle.precision import HEAD_PRECISIONS

__all__ = ["HEAD_PRECISIONS", "Eagle3Config", "Eagle3Head", "is_eagle_checkpoint", "load_head", "save_head"]
