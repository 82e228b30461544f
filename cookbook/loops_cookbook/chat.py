"""ChatML rendering (the chat format of loops/tiny and of Qwen-family models) straight to tokens.

Each message is `<|im_start|>ROLE\\nCONTENT<|im_end|>\\n`; a generation prompt is
`<|im_start|>assistant\\n`, and the sampler stops at `<|im_end|>`. Training weights are 1 on the
assistant's content and its closing `<|im_end|>`, 0 elsewhere. `template_matches` compares this
rendering with the tokenizer's own chat template (what `check` reports).
"""

from __future__ import annotations

from typing import Any, Sequence

START, END = "<|im_start|>", "<|im_end|>"

Message = dict[str, str]


class ChatML:
    """Renders conversations for one tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.start = self._special(START)
        self.end = self._special(END)

    def _special(self, text: str) -> int:
        ids = self.tok.encode(text, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"the tokenizer has no single token for {text}: the model does not use ChatML")
        return ids[0]

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode(self, tokens: Sequence[int]) -> str:
        return self.tok.decode(list(tokens), skip_special_tokens=True)

    @staticmethod
    def text(messages: Sequence[Message], add_generation_prompt: bool = False) -> str:
        """The conversation as a string (what the tokenizer's chat template should produce)."""
        out = "".join(f"{START}{m['role']}\n{m['content']}{END}\n" for m in messages)
        return out + (f"{START}assistant\n" if add_generation_prompt else "")

    def message(self, m: Message, train: bool) -> tuple[list[int], list[float]]:
        head = [self.start] + self.encode(m["role"] + "\n")
        body = self.encode(m["content"]) + [self.end]
        tail = self.encode("\n")
        w = 1.0 if train else 0.0
        return head + body + tail, [0.0] * len(head) + [w] * len(body) + [0.0] * len(tail)

    def conversation(self, messages: Sequence[Message], train_roles: tuple[str, ...] = ("assistant",)
                     ) -> tuple[list[int], list[float]]:
        """Tokens and per-token weights of a whole conversation."""
        tokens: list[int] = []
        weights: list[float] = []
        for m in messages:
            t, w = self.message(m, m["role"] in train_roles)
            tokens += t
            weights += w
        return tokens, weights

    def generation_prompt(self) -> list[int]:
        return [self.start] + self.encode("assistant\n")

    def prompt(self, messages: Sequence[Message]) -> list[int]:
        """Tokens of a conversation followed by the assistant's generation prompt."""
        return self.conversation(messages, ())[0] + self.generation_prompt()

    def continuation(self, action: Sequence[int], messages: Sequence[Message]) -> list[int]:
        """The tokens that follow a sampled assistant turn: close it (if the sampler stopped for
        length), then the new messages, then the next generation prompt. Appending these keeps
        every later prompt an extension of the earlier one, so a multi-turn episode is one datum."""
        out = [] if action and action[-1] == self.end else [self.end]
        out += self.encode("\n")
        return out + self.conversation(messages, ())[0] + self.generation_prompt()

    def response_text(self, action: Sequence[int]) -> str:
        """The text of a sampled assistant turn, without its closing token."""
        toks = list(action)
        if toks and toks[-1] == self.end:
            toks = toks[:-1]
        return self.decode(toks)


def template_matches(tokenizer: Any) -> tuple[bool, str]:
    """Whether the tokenizer's chat template renders a sample conversation exactly as ChatML does."""
    sample = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
              {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "2+2?"}]
    if not getattr(tokenizer, "chat_template", None):
        return False, "the tokenizer has no chat template"
    try:
        ChatML(tokenizer)
        theirs = tokenizer.apply_chat_template(sample, tokenize=False, add_generation_prompt=True)
    except Exception as e:  # noqa: BLE001 - reported, not raised
        return False, str(e)
    ours = ChatML.text(sample, add_generation_prompt=True)
    if theirs == ours:
        return True, "ChatML, same as the model's chat template"
    i = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b), min(len(theirs), len(ours)))
    return False, f"differs at char {i}: model {theirs[i:i + 30]!r} vs recipe {ours[i:i + 30]!r}"
