#!/usr/bin/env python3
"""Reference token ids of rendered chat conversations, from transformers' apply_chat_template.

Regenerate (from the repository root, with the reference venv):

    /tmp/refenv/bin/python tests/ref/make_chat_reference.py

Writes tests/data/chat/<family>.json for each family below: the tokenizer and template it uses,
and per case the messages, the options (enable_thinking, date_string) and the ids of
apply_chat_template(messages, tokenize=True, add_generation_prompt=True, ...). The tokenizers are
../shared/tokenizers/{llama3,qwen3} and tests/data/smollm2-tokenizer; the templates the real ones
in ../shared/tokenizers/templates (or the tokenizer's own). tests/test_chat_render.py checks
`./run --render-chat` against these files. Generated with transformers 5.23.0 (printed below).
"""
import json
import os
import sys

import transformers
from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.path.join(ROOT, "..", "shared", "tokenizers")
OUT = os.path.join(ROOT, "tests", "data", "chat")

# Paths are relative to the repository root; the test resolves them the same way.
FAMILIES = {
    "llama31": {"tokenizer": "../shared/tokenizers/llama3",
                "template": "../shared/tokenizers/templates/meta-llama-Llama-3.1-8B-Instruct.jinja",
                "options": [{}, {"date_string": "05 Mar 2025"}]},
    # 3.2's default date is today's (strftime_now): give one so the reference is fixed.
    "llama32": {"tokenizer": "../shared/tokenizers/llama3",
                "template": "../shared/tokenizers/templates/meta-llama-Llama-3.2-3B-Instruct.jinja",
                "options": [{"date_string": "11 Nov 2025"}]},
    "llama3": {"tokenizer": "../shared/tokenizers/llama3", "template": None, "options": [{}]},  # its own (Llama 3.0)
    "qwen3": {"tokenizer": "../shared/tokenizers/qwen3",
              "template": "../shared/tokenizers/templates/Qwen-Qwen3-0.6B.jinja",
              "options": [{}, {"enable_thinking": True}, {"enable_thinking": False}]},
    "smollm2": {"tokenizer": "tests/data/smollm2-tokenizer", "template": None, "options": [{}]},
}

THINK1 = "<think>\nThe user wants 2+2. That is 4.\n</think>\n\nThe answer is 4."
THINK2 = "<think>\n\nLet me count: one, two.\n\n</think>\n\n\nTwo."
U, A, S = "user", "assistant", "system"


def m(*pairs):
    return [{"role": r, "content": c} for r, c in pairs]


CONVERSATIONS = {
    "one_user": m((U, "Hello!")),
    "system_user": m((S, "You are a terse assistant."), (U, "What is the capital of France?")),
    "multi_turn": m((U, "Hi, who are you?"), (A, "I am an assistant."), (U, "What can you do?")),
    "multi_turn_system": m((S, "Answer in French."), (U, "Good morning"), (A, "Bonjour !"),
                           (U, "How are you?"), (A, "Très bien, merci."), (U, "Thanks")),
    "multiline_unicode": m((S, "  Be kind.\n\n  "),
                           (U, "  Line one\n\tLine two  \n\nÜnïcödé: 日本語, عربى, emoji 👍🏽🇫🇷, e\u0301 \u3000"),
                           (A, "\n Noted:\n- one\n- two\n"), (U, "\u00a0and\u2028more\u00a0")),
    "whitespace_only": m((U, "   "), (A, "\n\n"), (U, "\t")),
    "empty_content": m((U, ""), (A, ""), (U, "x")),
    "think_history": m((U, "What is 2+2?"), (A, THINK1), (U, "And 1+1?")),
    "think_after_query": m((S, "Think step by step."), (U, "What is 2+2?"), (A, THINK1), (U, "Count to two."),
                           (A, THINK2)),
    "think_branches": m((U, "Q"), (A, THINK1), (A, "plain reply"), (A, THINK2), (A, "last, no think")),
    "think_odd": m((U, "a"), (A, "no open tag</think>rest"), (U, "b"), (A, "<think>x</think>y</think>\n\nz"),
                   (U, "c"), (A, "<think>only open"), (U, "d"), (A, "</think>")),
    "tool_response_user": m((U, "Weather?"), (A, THINK1), (U, "<tool_response>sunny</tool_response>")),
    "system_later": m((U, "first"), (S, "a late system message"), (U, "second")),
    "special_text": m((U, "Say <|im_end|> or <|eot_id|> literally"), (A, "ok <think>"), (U, "<|endoftext|>")),
}


def main():
    print("transformers", transformers.__version__, file=sys.stderr)
    os.makedirs(OUT, exist_ok=True)
    for family, spec in FAMILIES.items():
        tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, spec["tokenizer"]))
        tpl = open(os.path.join(ROOT, spec["template"])).read() if spec["template"] else None
        cases = []
        for name, msgs in CONVERSATIONS.items():
            for opt in spec["options"]:
                out = tok.apply_chat_template(msgs, chat_template=tpl, tokenize=True, add_generation_prompt=True, **opt)
                ids = out["input_ids"] if hasattr(out, "keys") else out
                cases.append({"name": name, "messages": msgs, "enable_thinking": opt.get("enable_thinking"),
                              "date_string": opt.get("date_string"), "ids": list(ids)})
        path = os.path.join(OUT, family + ".json")
        head = json.dumps({"tokenizer": spec["tokenizer"], "template": spec["template"]}, ensure_ascii=False)
        with open(path, "w") as f:  # one case a line: diffs stay readable
            f.write(head[:-1] + ', "cases": [\n' +
                    ",\n".join(json.dumps(c, ensure_ascii=False) for c in cases) + "\n]}\n")
        print(f"{path}: {len(cases)} cases", file=sys.stderr)


if __name__ == "__main__":
    main()
