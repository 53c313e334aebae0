#!/usr/bin/env python3
"""Writes chat_golden.json: renders of the chat templates under models/ made
with Python's jinja2 (Debian: python3-jinja2) set up as Hugging Face
transformers' apply_chat_template sets it up (sandboxed environment,
trim_blocks, lstrip_blocks, loopcontrols, raise_exception, tojson without
ASCII escaping; special tokens and enable_thinking=False passed as
variables). The Go test TestChatTemplatesMatchJinja2 compares.

Run from this directory:  python3 gen_chat.py
"""
import json
import os

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

MODELS = ["qwen2.5", "qwen3", "llama3", "llama3.1", "multiline"]

CONVERSATIONS = [
    ("system+user", [
        {"role": "system", "content": "You are the Verifier. Reply <verify>yes</verify> or <verify>no</verify>."},
        {"role": "user", "content": "Question: what is 2+2?\nAnswer: 4"},
    ]),
    ("user only", [
        {"role": "user", "content": "Hello!"},
    ]),
    ("multi-turn", [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Search for the capital of France."},
        {"role": "assistant", "content": "<search>capital of France</search>"},
        {"role": "user", "content": "<information>Paris is the capital of France.</information>"},
    ]),
    ("thinking in history", [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n2"},
        {"role": "user", "content": "and 2+2?"},
    ]),
    ("ends with assistant", [
        {"role": "user", "content": "Say hi."},
        {"role": "assistant", "content": "hi"},
    ]),
    ("empty turn", [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "b"},
    ]),
    ("awkward content", [
        {"role": "user", "content": "  {{ not a tag }} {% raw %} 'quotes' \"double\" \\backslash\\ 中文 😀  \n"},
    ]),
]


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def token(v):
    if isinstance(v, dict):
        return v.get("content")
    return v


def main():
    env = environment()
    cases = []
    for model in MODELS:
        with open(os.path.join("models", model, "tokenizer_config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        template = env.from_string(cfg["chat_template"])
        special = {k: token(cfg[k]) for k in ("bos_token", "eos_token", "pad_token", "unk_token")
                   if token(cfg.get(k)) is not None}
        for name, messages in CONVERSATIONS:
            for gen in (True, False):
                text = template.render(messages=messages, tools=None, documents=None,
                                       add_generation_prompt=gen, enable_thinking=False, **special)
                cases.append({"model": model, "name": name, "add_generation_prompt": gen,
                              "messages": messages, "want": text})
    with open("chat_golden.json", "w", encoding="utf-8") as f:
        json.dump({"jinja2_version": jinja2.__version__, "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
