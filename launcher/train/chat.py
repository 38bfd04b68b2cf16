"""Conversations: OpenAI-style `messages` (role / content) and ShareGPT `conversations` (from /
value), rendered with the tokenizer's chat template and trained on the assistant turns only.

Where each assistant turn lies in the rendered text is found from the template itself: the
conversation up to that turn rendered with the generation prompt is a prefix of the conversation
through that turn, and what the turn adds (its content and the template's end-of-turn marker) is
what the model learns to say. The whole conversation is tokenised once, and a token is trained on
when it starts inside such a span (character offsets of a fast tokenizer). A template that
rewrites earlier turns when later ones are added has no such prefixes and is refused by name.
"""

from __future__ import annotations

ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "tool": "tool"}
FORMATS = "messages (role/content) or conversations (ShareGPT from/value)"

# The built-in byte tokenizer's template (demos and tests with --init random, offline): each turn
# is <s>role, a newline, its content and </s>; the generation prompt opens an assistant turn.
BYTE_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


class ConversationError(ValueError):
    """A record that is a conversation but not a trainable one (the message says why)."""


def conversation(row: object) -> list[dict] | None:
    """The turns of a conversation record as [{"role", "content"}], None if the record is not one,
    ConversationError if it is one that cannot be trained on."""
    if not isinstance(row, dict):
        return None
    if isinstance(row.get("messages"), list):
        turns, role_key, text_key, roles = row["messages"], "role", "content", {r: r for r in ROLES}
    elif isinstance(row.get("conversations"), list):
        turns, role_key, text_key, roles = row["conversations"], "from", "value", SHAREGPT_ROLES
    else:
        return None
    out = []
    for i, turn in enumerate(turns, 1):
        if not isinstance(turn, dict) or not isinstance(turn.get(text_key), str):
            raise ConversationError(f"turn {i} is not an object with a string {text_key!r}")
        role = turn.get(role_key)
        if role not in roles:
            raise ConversationError(f"turn {i} has {role_key} {role!r}; accepted: {', '.join(roles)}")
        out.append({"role": roles[role], "content": turn[text_key]})
    if not any(t["role"] == "assistant" for t in out):
        raise ConversationError("no assistant turn, so nothing to train on")
    return out


def template_problem(tokenizer) -> str | None:
    """Why this tokenizer cannot render conversations, or None."""
    if not getattr(tokenizer, "chat_template", None):
        return (
            "the tokenizer has no chat template to render them with; use the tokenizer of an instruct / chat "
            "model (--tokenizer), or convert the records to prompt/response"
        )
    if not getattr(tokenizer, "is_fast", False):
        return "they need a fast tokenizer (its character offsets find the assistant's tokens); this one is not"
    return None


def _render(tokenizer, turns: list[dict], generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=generation_prompt)


def assistant_spans(tokenizer, turns: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of its assistant turns (each turn's
    content and end-of-turn marker, trailing whitespace left out)."""
    try:
        whole = _render(tokenizer, turns)
        spans = []
        for k, turn in enumerate(turns):
            if turn["role"] != "assistant":
                continue
            before = _render(tokenizer, turns[:k], generation_prompt=True) if k else ""
            through = _render(tokenizer, turns[: k + 1])
            if not (through.startswith(before) and whole.startswith(through)):
                raise ConversationError(
                    "the chat template renders earlier turns differently once later ones follow, so the "
                    "assistant's tokens cannot be told apart; convert the records to prompt/response"
                )
            end = len(through.rstrip())
            if end > len(before):
                spans.append((len(before), end))
    except ConversationError:
        raise
    except Exception as exc:  # jinja's TemplateError: the template's own checks (e.g. role order)
        raise ConversationError(f"the chat template refuses it: {str(exc).splitlines()[0][:160]}") from None
    return whole, spans


def encode(tokenizer, turns: list[dict], chars: int) -> tuple[list[int], list[bool]]:
    """Token ids of the rendered conversation (its first `chars` characters) and, per token, whether
    it is trained on (it starts inside an assistant turn)."""
    text, spans = assistant_spans(tokenizer, turns)
    enc = tokenizer(text[:chars], add_special_tokens=False, return_offsets_mapping=True)
    trained = [any(a <= start < b for a, b in spans) for start, _ in enc["offset_mapping"]]
    return enc["input_ids"], trained
