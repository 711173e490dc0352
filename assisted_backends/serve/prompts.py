"""A request's prompt as token ids: the chat template for messages, the tokenizer for text, and the context.

Chat messages are rendered by the tokenizer's chat template (or the server's `--chat-template` file) with the
assistant turn's opener, then tokenized without adding special tokens again (the template writes them), as
`run-assisted-generation --chat` does; a request's tools are rendered by the template when it knows tools, else
written into the messages (`tools`). A completion's text is tokenized as `run-assisted-generation --prompt`
tokenizes it. A prompt plus its `max_tokens` must fit the context: refused with 400 naming the field otherwise.
A text far longer than the context could hold is refused before it is tokenized.
"""

from __future__ import annotations

from dataclasses import dataclass

from assisted_backends.serve.errors import APIError, invalid
from assisted_backends.serve.schemas import GenerationRequest
from assisted_backends.serve.tokenizers import PerThread
from assisted_backends.serve.tools import as_generic, renders_tools


@dataclass(frozen=True)
class PromptMaker:
    """The tokenizer (a copy per thread), an optional chat template overriding its own, the context in tokens,
    the vocabulary size, and the most characters one token decodes to (`longest_token`), which bounds a prompt's
    text cheaply."""

    tokenizers: PerThread
    chat_template: str | None
    context: int
    vocab_size: int
    longest_token: int

    @classmethod
    def of(cls, tokenizer, chat_template: str | None, context: int, vocab_size: int) -> PromptMaker:
        longest = max((len(token) for token in tokenizer.get_vocab()), default=16)
        return cls(PerThread(tokenizer), chat_template, context, vocab_size, max(longest, 16))

    @property
    def has_chat_template(self) -> bool:
        return self.chat_template is not None or bool(getattr(self.tokenizers.original, "chat_template", None))

    def token_ids(self, request: GenerationRequest) -> list[int]:
        """The prompt's token ids, checked against the context and the vocabulary."""
        if request.chat:
            param = "messages"
            text = self._render(request)
            self._bound(text, param)
            ids = self.tokenizers.get()(text, add_special_tokens=False).input_ids
        elif request.token_ids is not None:
            param, ids = "prompt", list(request.token_ids)
            if max(ids) >= self.vocab_size:
                raise invalid("prompt", f"token id {max(ids)} is outside the vocabulary (size {self.vocab_size})")
        else:
            param = "prompt"
            self._bound(request.text, param)
            ids = self.tokenizers.get()(request.text).input_ids
        if not ids:
            raise invalid(param, "is empty after tokenization: send some text")
        if len(ids) >= self.context:
            raise APIError(400, f"{param}: the prompt is {len(ids)} tokens; this server's context is {self.context} "
                           "tokens, and at least one must be left to generate: shorten it", param,
                           "context_length_exceeded")  # fmt: skip
        return ids

    def tokenize(self, text: str, add_special: bool) -> list[int]:
        """`/tokenize`: the token ids of `text` (with the tokenizer's special tokens when `add_special`)."""
        self._bound(text, "content")
        return list(self.tokenizers.get()(text, add_special_tokens=add_special).input_ids)

    def limit(self, request: GenerationRequest, prompt_tokens: int) -> int:
        """The request's max_tokens, or what the context leaves; refused when the two do not fit the context."""
        room = self.context - prompt_tokens
        if request.max_tokens is None:
            return room
        if request.max_tokens > room:
            name = "max_completion_tokens" if request.chat else "max_tokens"
            raise APIError(400, f"{name}: {request.max_tokens} tokens after a prompt of {prompt_tokens} exceed this "
                           f"server's context of {self.context} tokens; ask for at most {room}", name,
                           "context_length_exceeded")  # fmt: skip
        return request.max_tokens

    def _bound(self, text: str, param: str) -> None:
        if len(text) > self.context * self.longest_token:
            raise APIError(400, f"{param}: {len(text)} characters cannot fit this server's context of {self.context} "
                           "tokens; shorten it", param, "context_length_exceeded")  # fmt: skip

    def _render(self, request: GenerationRequest) -> str:
        if not self.has_chat_template:
            raise APIError(400, "messages: this model's tokenizer has no chat template; start the server with "
                           "--chat-template FILE or use /v1/completions", "messages", "no_chat_template")  # fmt: skip
        tokenizer = self.tokenizers.get()
        messages, tools = list(request.messages), request.tools
        if renders_tools(self.chat_template or tokenizer.chat_template):
            options = {"tools": tools.template_tools()} if tools is not None else {}
        else:
            messages, options = as_generic(messages, tools), {}
        try:
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                 chat_template=self.chat_template, **options)  # fmt: skip
        except Exception as error:  # noqa: BLE001 - a template may raise on the order of roles
            raise invalid("messages", f"the chat template refused them: {error}") from None
