"""Drafts of another tokenizer than the target's: tokens translated through bytes, rows drafted one by one."""
