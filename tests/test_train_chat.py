"""Conversation data: `messages` and ShareGPT records rendered with the tokenizer's chat template,
trained on the assistant turns only (checked token by token), and the bad records and tokenizers
that stop a launch in one line before any rank starts."""

from __future__ import annotations

import json

import pytest

from launcher.cli import main
from launcher.train.data import IGNORE, DataError, read_records, tokenize

pytest.importorskip("transformers")

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 plus 3?"},
    {"role": "assistant", "content": "5"},
    {"role": "user", "content": "And 4 plus 4?"},
    {"role": "assistant", "content": "8, twice 4."},
]
SHAREGPT = {"system": "system", "user": "human", "assistant": "gpt"}
# a ChatML-style template with its own markers (plain text for the byte tokenizer), and one that
# raises on a bad role order the way Llama-2 / Mistral templates do
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
STRICT = (
    "{% for m in messages %}{% if m['role'] == 'user' and loop.index0 % 2 == 1 %}"
    "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
)
# drops every earlier assistant turn's content, as some reasoning templates drop earlier thoughts
REWRITING = (
    "{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}[a]{% else %}"
    "[{{ m['role'] }}]{{ m['content'] }}{% endif %}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
)


@pytest.fixture
def tok():
    from launcher.train.tokenizer import byte_tokenizer

    return byte_tokenizer()


def expected(turns, open_turn: str, close_turn: str) -> tuple[str, str]:
    """The rendered text and, character for character, which characters are trained on ('x'):
    an assistant turn's content and its end-of-turn marker, nothing else."""
    text, mask = "", ""
    for t in turns:
        head, body, tail = f"{open_turn}{t['role']}\n", t["content"] + close_turn, "\n"
        text += head + body + tail
        mask += "." * len(head) + ("x" if t["role"] == "assistant" else ".") * len(body) + "." * len(tail)
    return text, mask


def per_char(tok, ids, labels) -> tuple[str, str]:
    """The byte tokenizer's tokens are single bytes or one special token each: the text and mask."""
    text, mask = "", ""
    for i, label in zip(ids, labels, strict=True):
        piece = tok.decode([i])
        assert label in (IGNORE, i)
        text += piece
        mask += ("x" if label == i else ".") * len(piece)
    return text, mask


@pytest.mark.parametrize("template, open_turn, close_turn", [(None, "<s>", "</s>"), (CHATML, "<|im_start|>", "<|im_end|>")])
@pytest.mark.parametrize("form", ["messages", "sharegpt"])
def test_only_the_assistant_turns_are_trained_on_token_by_token(tok, tmp_path, form, template, open_turn, close_turn):
    if template:
        tok.chat_template = template
    if form == "messages":
        row = {"messages": CONVERSATION}
    else:
        row = {"conversations": [{"from": SHAREGPT[t["role"]], "value": t["content"]} for t in CONVERSATION]}
    (tmp_path / "chat.jsonl").write_text(json.dumps(row) + "\n")
    ex = tokenize(read_records(str(tmp_path / "chat.jsonl")), tok, 512, "chat.jsonl")
    got = per_char(tok, ex.input_ids[0], ex.labels[0])
    assert got == expected(CONVERSATION, open_turn, close_turn)
    assert got[0] == tok.apply_chat_template(CONVERSATION, tokenize=False)  # what the template renders


def test_a_conversation_cut_by_the_sequence_length_keeps_the_assistant_tokens_in_reach(tok):
    text, mask = expected(CONVERSATION, "<s>", "</s>")
    whole = tokenize([("line 1", {"messages": CONVERSATION})], tok, 512, "f")
    cut = text.index("8, twice") + 3  # characters; the specials are one token each
    n = next(k for k in range(len(whole.input_ids[0])) if len(tok.decode(whole.input_ids[0][:k])) == cut)
    ex = tokenize([("line 1", {"messages": CONVERSATION})], tok, n, "f")
    assert per_char(tok, ex.input_ids[0], ex.labels[0]) == (text[:cut], mask[:cut])
    # nothing of the assistant's in reach: counted, not trained on
    early = tokenize([("line 1", {"messages": CONVERSATION}), ("line 2", {"prompt": "q", "response": "a"})], tok, 8, "f")
    assert (len(early.input_ids), early.no_target) == (1, 1)


def test_the_shipped_conversation_demo_set_trains(tok):
    ex = tokenize(read_records("demo-chat"), tok, 256, "demo-chat")
    assert len(ex.input_ids) > 100 and ex.skipped == ex.no_target == 0
    multi = [lab for lab in ex.labels if tok.decode([t for t in lab if t != IGNORE]).count("</s>") == 2]
    assert multi  # multi-turn: both assistant answers are trained on


@pytest.mark.parametrize(
    "row, needle",
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant turn"),
        ({"messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "yo"}]}, "turn 2 has role 'bot'"),
        ({"conversations": [{"from": "human", "value": "hi"}, {"from": "model", "value": "yo"}]}, "turn 2 has from 'model'"),
        ({"messages": [{"role": "user", "content": 3}]}, "turn 1 is not an object with a string 'content'"),
        ({"messages": []}, "no assistant turn"),
    ],
)
def test_bad_conversations_name_the_file_and_line(tok, row, needle):
    records = [("line 1", {"messages": CONVERSATION}), ("line 2", row)]
    with pytest.raises(DataError, match="chat.jsonl line 2: ") as err:
        tokenize(records, tok, 256, "chat.jsonl")
    assert needle in str(err.value) and "--skip-bad-records" in str(err.value)
    ex = tokenize(records, tok, 256, "chat.jsonl", skip_bad=True)
    assert (len(ex.input_ids), ex.skipped) == (1, 1)


def test_templates_that_cannot_be_trained_through_are_refused(tok):
    tok.chat_template = STRICT
    with pytest.raises(DataError, match="line 1: the chat template refuses it: roles must alternate"):
        tokenize([("line 1", {"messages": CONVERSATION})], tok, 256, "chat.jsonl")
    tok.chat_template = REWRITING
    with pytest.raises(DataError, match="renders earlier turns differently once later ones follow"):
        tokenize([("line 1", {"messages": CONVERSATION})], tok, 256, "chat.jsonl")
    tok.chat_template = None
    with pytest.raises(DataError, match="chat.jsonl holds conversations, and the tokenizer has no chat template"):
        tokenize([("line 1", {"messages": CONVERSATION})], tok, 256, "chat.jsonl", skip_bad=True)  # never skipped


TINY = ["--model", "tiny-llama", "--gpus", "1x2xA100", "--cpu", "--init", "random", "--detach"]


def test_a_bad_conversation_file_stops_the_launch_in_one_line(tok, tmp_path, capsys):
    good = json.dumps({"messages": CONVERSATION})
    cases = {
        "no-assistant": [good, json.dumps({"messages": [{"role": "user", "content": "hi"}]})],
        "unknown-role": [good, json.dumps({"messages": [{"role": "robot", "content": "hi"}]})],
    }
    for name, lines in cases.items():
        data = tmp_path / f"{name}.jsonl"
        data.write_text("\n".join(lines) + "\n")
        code = main([*TINY, "--runs-dir", str(tmp_path / "runs"), "--name", name, "--data", str(data)])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1, err
        assert f"{name}.jsonl line 2: " in err[0], err
        assert not (tmp_path / "runs" / name / "job.json").exists()  # no rank started
    # a tokenizer without a chat template (the byte tokenizer saved without one)
    tok.chat_template = None
    tok.save_pretrained(str(tmp_path / "plain-tokenizer"))
    data = tmp_path / "chat.jsonl"
    data.write_text(good + "\n")
    argv = [*TINY, "--runs-dir", str(tmp_path / "runs"), "--name", "plain", "--data", str(data)]
    code = main([*argv, "--tokenizer", str(tmp_path / "plain-tokenizer")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "chat.jsonl holds conversations, and the tokenizer has no chat template" in err[0]
