"""Prompt formats: how an instruction (and an optional chat history) becomes token ids.

Two styles: ``chat`` uses the tokenizer's own chat template (instruct models such as
SmolLM2-Instruct); ``alpaca`` is the Alpaca/MetaMath template used to fine-tune base models
(LLaMA-2-7B, Mistral-7B, Gemma-7B) that ship without one. Prompt and response are encoded
separately, so the response tokens (the only ones trained on) are exactly known, and generation
at evaluation time starts from the same prompt ids that training used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # light at import: the instruction helpers serve the light sources module
    from transformers import PreTrainedTokenizerBase

PromptStyle = Literal["chat", "alpaca"]

ALPACA_HEADER = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
)


def resolve_style(tokenizer: PreTrainedTokenizerBase, style: str) -> PromptStyle:
    """``auto`` -> ``chat`` when the tokenizer has a chat template, else ``alpaca``."""
    if style == "auto":
        return "chat" if tokenizer.chat_template else "alpaca"
    if style == "chat" and not tokenizer.chat_template:
        raise ValueError("prompt_style='chat' but the tokenizer has no chat template")
    return style  # type: ignore[return-value]


def _messages(conversation: list[str]) -> list[dict[str, str]]:
    roles = ("user", "assistant")
    return [{"role": roles[i % 2], "content": text} for i, text in enumerate(conversation)]


def render_prompt(tokenizer: PreTrainedTokenizerBase, style: PromptStyle, conversation: list[str]) -> str:
    """Text up to where the assistant's next reply starts.

    ``conversation`` alternates user and assistant turns and ends with a user turn.
    """
    if len(conversation) % 2 != 1:
        raise ValueError("a conversation to prompt with must end with a user turn")
    if style == "chat":
        return tokenizer.apply_chat_template(_messages(conversation), tokenize=False, add_generation_prompt=True)
    turns = [
        f"### Instruction:\n{text}\n\n" if i % 2 == 0 else f"### Response:\n{text}{_reply_end(tokenizer)}\n\n"
        for i, text in enumerate(conversation)
    ]
    return ALPACA_HEADER + "".join(turns) + "### Response:\n"


def _reply_end(tokenizer: PreTrainedTokenizerBase) -> str:
    """What ends an Alpaca-style reply's text: the end-of-sequence token, as training ends it
    (FastChat's Alpaca template too)."""
    return tokenizer.eos_token or ""


def _rendered_reply(tokenizer: PreTrainedTokenizerBase, style: PromptStyle, conversation: list[str]) -> str:
    """Text of a conversation that ends with an assistant turn, through its end-of-turn marker."""
    if style == "alpaca":
        return render_prompt(tokenizer, style, conversation[:-1]) + conversation[-1] + _reply_end(tokenizer)
    return tokenizer.apply_chat_template(_messages(conversation), tokenize=False)


def encode_prompt(tokenizer: PreTrainedTokenizerBase, style: PromptStyle, conversation: list[str]) -> list[int]:
    """Token ids of ``render_prompt`` (the chat template writes its own special tokens; the
    Alpaca text gets the tokenizer's usual BOS)."""
    text = render_prompt(tokenizer, style, conversation)
    return tokenizer(text, add_special_tokens=style == "alpaca").input_ids


def encode_response(
    tokenizer: PreTrainedTokenizerBase, style: PromptStyle, conversation: list[str], response: str
) -> list[int]:
    """Token ids of the assistant's reply including its end-of-turn marker: the suffix the chat
    template adds after the prompt, or the response plus EOS in Alpaca style."""
    if style == "alpaca":
        return tokenizer(response, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    prompt = render_prompt(tokenizer, style, conversation)
    full = _rendered_reply(tokenizer, style, [*conversation, response])
    if not full.startswith(prompt):
        raise ValueError(
            "the chat template does not render a reply as a suffix of its prompt; use prompt_style='alpaca'"
        )
    return tokenizer(full[len(prompt) :], add_special_tokens=False).input_ids


def encode_exchanges(
    tokenizer: PreTrainedTokenizerBase, style: PromptStyle, conversation: list[str]
) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, reply ids) of each exchange of a conversation, in order: concatenated, they are
    the conversation's tokens, and every reply is trained on. The first prompt is ``encode_prompt``'s;
    a later one is the text its rendered prompt adds after the previous reply, so that a model asked
    the next turn (MT-Bench's second) sees the tokens it was trained on.

    Args:
        tokenizer: the model's tokenizer.
        style: ``chat`` or ``alpaca`` (``resolve_style``).
        conversation: user and assistant turns alternating, from a user turn to an assistant one.

    Returns:
        One (prompt ids, reply ids) pair per user turn.

    Raises:
        ValueError: the conversation does not end with a reply, or the chat template renders a
            later prompt that does not continue the earlier exchanges.
    """
    if len(conversation) % 2:
        raise ValueError("a conversation to train on must end with an assistant turn")
    exchanges = [
        (
            encode_prompt(tokenizer, style, conversation[:1]),
            encode_response(tokenizer, style, conversation[:1], conversation[1]),
        )
    ]
    for reply in range(3, len(conversation), 2):  # a conversation's later exchanges, each after what came before
        asked = conversation[:reply]
        prompt, before = render_prompt(tokenizer, style, asked), _rendered_reply(tokenizer, style, asked[:-1])
        if not prompt.startswith(before):
            raise ValueError("the chat template does not render a conversation turn by turn; use prompt_style='alpaca'")
        prompt_ids = tokenizer(prompt[len(before) :], add_special_tokens=False).input_ids
        exchanges.append((prompt_ids, encode_response(tokenizer, style, asked, conversation[reply])))
    return exchanges


# --- instructions shared by training sets and evaluation suites -----------------------------
def mbpp_instruction(text: str, tests: list[str]) -> str:
    """The MBPP prompt of Austin et al. (2021): the task plus the asserts to satisfy."""
    return (
        f"You are an expert Python programmer, and here is your task: {text} "
        "Your code should pass these tests:\n\n" + "\n".join(tests)
    )


def humaneval_instruction(prompt: str) -> str:
    return f"Complete the following Python function:\n```python\n{prompt}```"
