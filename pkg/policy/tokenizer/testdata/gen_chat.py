#!/usr/bin/env python3
"""Writes the golden renders that the Go tests compare against, made with
Python's jinja2 (Debian: python3-jinja2) set up exactly as Hugging Face
transformers' apply_chat_template sets it up: an ImmutableSandboxedEnvironment
with trim_blocks, lstrip_blocks and loopcontrols; tojson without ASCII
escaping; raise_exception and strftime_now as globals; messages, tools=None,
documents=None, add_generation_prompt and the special tokens passed as
variables, plus any chat_template_kwargs. strftime_now is pinned to NOW so
the renders are reproducible; the Go tests pin their clock to the same time.

  jinja_golden.json  small templates probing the jinja2 semantics the chat
                     templates rely on (indexing, slicing, methods, filters...)
  chat_golden.json   the model templates under models/ on many conversations,
                     conversations with tools (definitions with nested
                     parameter schemas, assistant turns with one and two tool
                     calls, tool results, final answers) included
  hf_golden.json     the templates of the real tokenizer packages (only when
                     the folder named by DRMAS_HF_TOKENIZERS, default
                     ../../../../.cache/hf-tokenizers, was installed by
                     scripts/hf-tokenizers.sh)

Run from this directory:  python3 gen_chat.py
"""
import datetime
import json
import os

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

NOW = datetime.datetime(2026, 2, 3, 14, 5, 6)

MODELS = ["qwen2.5", "qwen3", "llama3", "llama3.1", "multiline", "mistral", "mistral-small-3.1",
          "deepseek-r1-distill"]
HF_MODELS = ["qwen2_5", "qwen3", "llama3", "llama3_1", "llama3_2", "deepseek_v3"]

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
    # What a model writes when the prompt already opened the think block.
    ("think closed but not opened", [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "add them\n</think>\n\n2"},
        {"role": "user", "content": "and 2+2?"},
    ]),
    ("think closed but not opened, last", [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "add them\n</think>\n\n2"},
    ]),
    ("reasoning_content", [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "2", "reasoning_content": "add one and one"},
        {"role": "user", "content": "and 2+2?"},
    ]),
    ("reasoning_content, last", [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "2", "reasoning_content": "add one and one"},
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
    ("tool turn", [
        {"role": "user", "content": "Look up the capital of France."},
        {"role": "assistant", "content": "<search>capital of France</search>"},
        {"role": "tool", "content": "Paris"},
    ]),
    ("awkward content", [
        {"role": "user", "content": "  {{ not a tag }} {% raw %} 'quotes' \"double\" \\backslash\\ 中文 😀  \n"},
    ]),
]

# A tool schema with its keys in sorted order (also right for template
# arguments handed over as Go maps, which tojson writes sorted).
TOOLS = [{"function": {"description": "Search the corpus.", "name": "search",
                       "parameters": {"properties": {"query": {"description": "what to look for", "type": "string"}},
                                      "required": ["query"], "type": "object"}},
          "type": "function"}]

# Tool definitions as users write them, keys in their natural (unsorted)
# order, with nested parameter schemas: the Go side gets them as raw JSON and
# must keep the order, as Python's dicts do.
FUNCTION_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city. Température in °C unless asked otherwise.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City and country, e.g. \"Paris, France\""},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                "options": {"type": "object", "properties": {
                    "hourly": {"type": "boolean"},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                    "threshold": {"type": "number", "default": 0.5},
                }, "required": ["days"]},
            },
            "required": ["location"],
        },
    }},
    {"type": "function", "function": {
        "name": "search",
        "description": "Search the corpus for passages.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "filters": {"type": "object", "properties": {
                    "years": {"type": "array", "items": {"type": "integer"}},
                    "source": {"type": ["string", "null"]},
                }},
                "top_k": {"type": "integer", "default": 5},
            },
            "required": ["query", "filters"],
        },
    }},
]

CALL_WEATHER = {"id": "a1b2c3d4e", "type": "function", "function": {
    "name": "get_weather", "arguments": {"location": "Paris, France", "unit": "celsius", "options": {"days": 2, "hourly": False, "threshold": 1.5}}}}
CALL_SEARCH = {"id": "f5g6h7i8j", "type": "function", "function": {
    "name": "search", "arguments": {"query": "capital of France <b>&</b> 'quotes'", "filters": {"years": [2024, 2025], "source": None}, "top_k": 3}}}
# OpenAI's wire form: the arguments are a string holding JSON.
CALL_WEATHER_STRING = {"id": "a1b2c3d4e", "type": "function", "function": {
    "name": "get_weather", "arguments": "{\"location\": \"Berlin\", \"unit\": \"fahrenheit\"}"}}

TOOL_CONVERSATIONS = [
    ("tools: one call", [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL_WEATHER]},
        {"role": "tool", "content": "{\"temperature\": 21, \"sky\": \"sunny\"}", "tool_call_id": "a1b2c3d4e", "name": "get_weather"},
        {"role": "assistant", "content": "It is 21 °C and sunny in Paris."},
    ]),
    ("tools: two calls", [
        {"role": "user", "content": "Weather in Paris, and what is the capital of France?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL_WEATHER, CALL_SEARCH]},
        {"role": "tool", "content": "21 °C, sunny", "tool_call_id": "a1b2c3d4e", "name": "get_weather"},
        {"role": "tool", "content": "Paris is the capital of France.", "tool_call_id": "f5g6h7i8j", "name": "search"},
        {"role": "assistant", "content": "It is sunny (21 °C); the capital is Paris."},
    ]),
    ("tools: text and a call, result pending", [
        {"role": "user", "content": "Find the capital of France."},
        {"role": "assistant", "content": "Let me search for that.", "tool_calls": [CALL_SEARCH]},
        {"role": "tool", "content": "Paris is the capital of France.", "tool_call_id": "f5g6h7i8j", "name": "search"},
    ]),
    ("tools: string arguments", [
        {"role": "user", "content": "Weather in Berlin in fahrenheit?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL_WEATHER_STRING]},
        {"role": "tool", "content": "70 °F", "tool_call_id": "a1b2c3d4e", "name": "get_weather"},
    ]),
    ("tools: reasoning before a call", [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "I should call get_weather.", "tool_calls": [CALL_WEATHER]},
        {"role": "tool", "content": "21 °C", "tool_call_id": "a1b2c3d4e", "name": "get_weather"},
        {"role": "assistant", "content": "21 °C."},
        {"role": "user", "content": "Thanks!"},
    ]),
]

TOOL_KWARGS = [
    {"tools": FUNCTION_TOOLS},
    {"tools": FUNCTION_TOOLS, "enable_thinking": False},
    {"tools": FUNCTION_TOOLS, "tools_in_user_message": False, "date_string": "03 Dec 2026"},
]

KWARGS = [
    {"enable_thinking": False},
    {"enable_thinking": True},
    {"date_string": "01 Dec 2026"},
    {"tools": TOOLS},
    {"custom": "x", "enable_thinking": False, "tools": TOOLS},
]


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def strftime_now(fmt):
    return NOW.strftime(fmt)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def token(v):
    if isinstance(v, dict):
        return v.get("content")
    return v


def render(template, variables):
    """Returns {"want": text} or {"error": message}."""
    try:
        return {"want": template.render(**variables)}
    except Exception as e:  # the Go side must fail too
        return {"error": f"{type(e).__name__}: {e}"}


def chat_cases(env, folder, names):
    cases = []
    for model in names:
        path = os.path.join(folder, model, "tokenizer_config.json")
        if not os.path.exists(path):
            path = os.path.join(folder, model, "models", "tokenizer_config.json")
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
        template = env.from_string(cfg["chat_template"])
        special = {k: token(cfg[k]) for k in ("bos_token", "eos_token", "pad_token", "unk_token")
                   if token(cfg.get(k)) is not None}
        runs = [(name, messages, gen, {}) for name, messages in CONVERSATIONS for gen in (True, False)]
        runs += [(name, messages, True, kw) for name, messages in CONVERSATIONS[2:6] for kw in KWARGS]
        runs += [(name, messages, gen, TOOL_KWARGS[0]) for name, messages in TOOL_CONVERSATIONS for gen in (True, False)]
        # A kwarg the template never reads would only repeat a render.
        tool_kwargs = [kw for kw in TOOL_KWARGS[1:] if all(k in cfg["chat_template"] for k in kw)]
        runs += [(name, messages, True, kw) for name, messages in TOOL_CONVERSATIONS for kw in tool_kwargs + [{}]]
        for name, messages, gen, kwargs in runs:
            variables = dict(messages=messages, tools=None, documents=None, add_generation_prompt=gen, **special)
            variables.update(kwargs)
            case = {"model": model, "name": name, "add_generation_prompt": gen, "messages": messages}
            if kwargs:
                case["kwargs"] = kwargs
            case.update(render(template, variables))
            cases.append(case)
    return cases


def jinja_cases(env):
    msgs1 = [{"role": "user", "content": "only"}]
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u1"},
            {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"}]
    d = {"a": 1, "b": [1, "x"], "c": {"k": "v"}, "n": None}
    probes = [
        ("neg index list of one", '{{ ["a"][-1] }}', {}),
        ("neg index string of one", '{{ "a"[-1] }}', {}),
        ("neg index minus length", '{{ ["a","b","c"][-3] }}', {}),
        ("neg index past start", '{{ ["a","b","c"][-4] }}|', {}),
        ("index past end", '{{ ["a"][1] }}|', {}),
        ("last message of one", '{{ messages[-1].content }} {{ messages[-1]["role"] }}', {"messages": msgs1}),
        ("last message", '{{ messages[-1].content }}{{ messages[0]["content"] }}', {"messages": msgs}),
        ("string index unicode", '{{ "héllo"[1] }}{{ "中文😀"[-1] }}', {}),
        ("string slice unicode", '{{ "héllo"[1:3] }}|{{ "中文😀x"[1:-1] }}', {}),
        ("slices", '{{ "abcdef"[-9:] }}|{{ "abcdef"[:-2] }}|{{ "abcdef"[::2] }}|{{ "abcdef"[::-1] }}|'
                   '{{ "abcdef"[2:100] }}|{{ "abcdef"[-2:-5] }}|{{ "abcdef"[4:1:-1] }}', {}),
        ("list slices", '{{ messages[1:]|length }}{{ messages[:-1]|length }}{{ messages[-2:][0].content }}'
                        '{{ messages[::-1][0].content }}{{ messages[5:]|length }}', {"messages": msgs}),
        ("slice of variable bounds", '{% set n = 2 %}{{ "abcdef"[n:n+2] }}', {}),
        ("qwen3 think split", "{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}|"
                              "{{ c.split('</think>')[-1].lstrip('\\n') }}",
         {"c": "add them\n</think>\n\n2"}),
        ("qwen3 think split opened", "{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}|"
                                     "{{ c.split('</think>')[-1].lstrip('\\n') }}",
         {"c": "<think>\nadd\n</think>\n\n2"}),
        ("split forms", '{{ "  a  b ".split()|join(",") }}|{{ "a,b,,c".split(",")|join("|") }}|'
                        '{{ "a b c".split(" ", 1)|join("|") }}|{{ "a b c".rsplit(" ", 1)|join("|") }}|'
                        '{{ "a\\nb\\r\\nc".splitlines()|join("|") }}|{{ "".split(",")|length }}|{{ "".split()|length }}', {}),
        ("strip forms", '[{{ "xxaxx".strip("x") }}][{{ "\\n\\nhi\\n".lstrip("\\n") }}][{{ "  hi  ".rstrip() }}]'
                        '[{{ " \\t hi \\n".strip() }}][{{ "abcba".strip("ab") }}][{{ "hi".lstrip("") }}]', {}),
        ("starts and ends", '{{ "abc".startswith("a") }}{{ "abc".endswith("bc") }}{{ "abc".startswith("b") }}'
                            '{{ "<tool_response>x".startswith("<tool_response>") }}', {}),
        ("case and replace", '{{ "hello World".upper() }}{{ "HeLLo".lower() }}{{ "hello world".title() }}'
                             '{{ "hello".capitalize() }}{{ "a-b-c".replace("-", "+") }}{{ "a-b-c".replace("-", "", 1) }}', {}),
        ("find and count", '{{ "abcabc".find("c") }}{{ "abcabc".rfind("c") }}{{ "abc".find("z") }}{{ "abcabc".count("b") }}', {}),
        ("str join method", '{{ ", ".join(["a", "b"]) }}|{{ "".join(xs) }}', {"xs": ["x", "y"]}),
        ("format", '{{ "%s-%d"|format("a", 3) }}|{{ "{}+{}".format(1, 2) }}', {}),
        ("filters on lists", '{{ xs|length }}{{ xs|first }}{{ xs|last }}{{ xs|join("-") }}{{ xs|reverse|join }}'
                             '{{ xs|sort|join }}{{ xs|unique|join }}', {"xs": ["b", "a", "c", "a"]}),
        ("selectattr and map", '{{ messages|selectattr("role", "equalto", "user")|list|length }}'
                               '{{ messages|rejectattr("role", "equalto", "user")|map(attribute="content")|join(",") }}'
                               '{{ messages|map(attribute="role")|first }}', {"messages": msgs}),
        ("map filter", '{{ xs|map("upper")|join(",") }}', {"xs": ["a", "b"]}),
        ("string filters", '[{{ "  x y  "|trim }}][{{ "ab"|upper }}][{{ "AB"|lower }}][{{ "ab cd"|title }}]'
                           '[{{ "ab"|capitalize }}][{{ "a-b"|replace("-", "_") }}][{{ 5|string + "a" }}][{{ "5"|int + 1 }}]'
                           '[{{ "2.5"|float * 2 }}][{{ -3|abs }}][{{ 2.567|round(1) }}][{{ "abc"|length }}]', {}),
        ("default filter", '[{{ undefined_name|default("d") }}][{{ n|default("d") }}][{{ undefined_name|d("e") }}]'
                           '[{{ ""|default("f", true) }}]', {"n": None}),
        ("tojson", '{{ d|tojson }}|{{ "é<a>&\'"|tojson }}|{{ [1, 2.5, true, none]|tojson }}', {"d": d}),
        ("tojson indent", '{{ d|tojson(indent=4) }}', {"d": {"a": [1, {"b": "é"}], "c": {}}}),
        ("dict access", '{{ d.a }}{{ d["b"][1] }}{{ d.c.k }}{{ d["c"]["k"] }}[{{ d.missing }}][{{ d.n }}]', {"d": d}),
        ("dict methods", '{{ d.get("a") }}{{ d.get("zz", "dflt") }}[{{ d.get("zz") }}]{{ d.keys()|list|length }}'
                         '{% for k, v in d.items() %}{{ k }}{% endfor %}', {"d": d}),
        ("tests", '{{ x is string }}{{ 1 is string }}{{ d is mapping }}{{ xs is iterable }}{{ xs is sequence }}'
                  '{{ 1 is number }}{{ 1 is integer }}{{ n is none }}{{ undefined_name is defined }}'
                  '{{ n is defined }}{{ x is defined }}{{ undefined_name is undefined }}{{ true is boolean }}'
                  '{{ 1 is odd }}{{ 2 is even }}{{ "a" is in "abc" }}', {"x": "s", "d": d, "xs": [1], "n": None}),
        ("none and bools printed", '{{ none }}|{{ n }}|{{ true }}|{{ false }}|{{ undefined_name }}|{{ "a" ~ none }}|{{ 1 ~ 2 }}',
         {"n": None}),
        ("arithmetic", '{{ 7 // 2 }} {{ 7 % 3 }} {{ 2 ** 3 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 1 + 2 * 3 }} {{ -7 // 2 }} {{ "ab" * 2 }}', {}),
        ("list concat", '{% set xs = [] %}{% for m in messages %}{% set xs = xs + [m.role] %}{% endfor %}{{ xs|join(",") }}'
                        '|{{ ([1, 2] + [3])|length }}', {"messages": msgs}),
        ("namespace", '{% set ns = namespace(a=1, s="") %}{% for m in messages %}{% set ns.a = ns.a + 1 %}'
                      '{% set ns.s = ns.s + m.role[0] %}{% endfor %}{{ ns.a }}{{ ns.s }}', {"messages": msgs}),
        ("loop variables", '{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}'
                           '{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }};{% endfor %}', {"messages": msgs}),
        ("loop previtem nextitem", '{% for x in xs %}[{{ loop.previtem }}/{{ loop.nextitem }}]{% endfor %}',
         {"xs": ["a", "b", "c"]}),
        ("loop filter and controls", '{% for m in messages if m.role == "user" %}{{ m.content }}{% endfor %}|'
                                     '{% for x in [1,2,3,4] %}{% if x == 2 %}{% continue %}{% endif %}'
                                     '{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}', {"messages": msgs}),
        ("for else", '{% for x in xs %}{{ x }}{% else %}empty{% endfor %}', {"xs": []}),
        ("range", '{{ range(3)|list|join }}{% for i in range(1, 7, 2) %}{{ i }}{% endfor %}', {}),
        ("membership", '{{ "x" in "axb" }}{{ "k" in d }}{{ 3 in [1,2,3] }}{{ "z" not in d }}'
                       '{{ m.role not in ["tool", "x"] }}', {"d": {"k": 1}, "m": msgs[0]}),
        ("conditional expression", '{{ "a" if x else "b" }}{{ "c" if not x else "d" }}{{ x and "e" or "f" }}', {"x": True}),
        ("whitespace control", 'A\n{% if true %}\n  B\n{% endif %}\n  {% if true %}C{% endif %}\n{{- " D " -}}\n E', {}),
        ("comments and raw", 'a{# hidden #}b{% raw %}{{ c }}{% endraw %}', {}),
        ("macro", '{% macro m(x, y=2) %}{{ x }}-{{ y }}{% endmacro %}{{ m(1) }} {{ m(3, y=4) }}', {}),
        ("set block", '{% set s %}in {{ 1 + 1 }}{% endset %}[{{ s }}]', {}),
        ("comparisons", '{{ 1 < 2 }}{{ "a" == "a" }}{{ [1] == [1] }}{{ m == messages[0] }}{{ 2 >= 3 }}{{ none == none }}',
         {"m": msgs[0], "messages": msgs}),
        ("raise_exception", '{{ raise_exception("roles must alternate") }}', {}),
        ("strftime_now", '{{ strftime_now("%d %b %Y") }}|{{ strftime_now("%Y-%m-%d %H:%M:%S") }}|{{ strftime_now("%A %B %-d") }}', {}),
        ("content none", '{{ m.content is none }}{{ m.content is string }}[{{ m.content }}]', {"m": {"role": "assistant", "content": None}}),
        ("items loop on message", '{% for k, v in m.items() %}{{ k }}={{ v }};{% endfor %}', {"m": {"role": "user", "content": "c"}}),
        ("string iteration", '{% for ch in "héy" %}[{{ ch }}]{% endfor %}', {}),
        ("string comparison ops", '{{ "abc" < "abd" }}{{ "b" > "a" }}', {}),
        ("truthiness", '{{ "y" if [] else "n" }}{{ "y" if "" else "n" }}{{ "y" if {} else "n" }}{{ "y" if 0 else "n" }}'
                       '{{ "y" if none else "n" }}{{ "y" if undefined_name else "n" }}{{ "y" if "0" else "n" }}', {}),
        ("dictsort and items filter", '{% for k, v in d|dictsort %}{{ k }}{{ v }}{% endfor %}|{{ d|items|list|length }}',
         {"d": {"b": 2, "a": 1}}),
        ("sum min max", '{{ [1,2,3]|sum }}{{ [3,1,2]|min }}{{ [3,1,2]|max }}', {}),
        ("indent filter", '{{ "a\\nb"|indent(2) }}|{{ "a\\nb"|indent(2, true) }}', {}),
        ("string literal escapes", "[{{ '\\\\n'|length }}][{{ 'a\\\nb' }}][{{ '\\x41\\u00e9\\t' }}][{{ 'it\\'s' }}]"
                                   '[{{ "q\\"q" }}][{{ "\\101" }}]', {}),
        ("literal ending in a backslash", '{{ "\\\\" }}', {}),
        ("unknown escape", '{{ "\\q" }}', {}),
        ("tojson of a nested dict literal", '{% set t = {"type": "function", "function": {"name": "f", "parameters": '
                                            '{"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": ["integer", "null"]}}}}} %}'
                                            '{{ t|tojson }}|{{ t.function|tojson(indent=2) }}', {}),
        ("tojson options", '{% set t = {"b": [1, {"z": none, "y": true}], "a": "é😀<>"} %}{{ t|tojson(sort_keys=true) }}|'
                           '{{ t|tojson(separators=[",", ":"]) }}|{{ t|tojson(ensure_ascii=true) }}|{{ t|tojson(indent="\t") }}|'
                           '{{ []|tojson(indent=2) }}{{ {}|tojson(indent=2) }}|{{ s|tojson }}', {"s": "a\u0001\n\"\\\u2028"}),
        ("tojson floats", '{{ fs|tojson }}', {"fs": [1.5, 1e20, 0.0001, 1e-05, 2.0, 100000.0, 1e16, 1e15, 123456789.123, -0.5, 3]}),
        ("tests on nested values", '{% set t = {"a": {"y": [1, {"z": "s"}], "x": "é"}} %}{{ t is mapping }}{{ t.a is mapping }}'
                                   '{{ t.a.y is string }}{{ t.a.x is string }}{{ t.a.y is iterable }}{{ t.a.y is sequence }}'
                                   '{{ t.a.y[1] is mapping }}{{ t.a.x is iterable }}{{ t.a.x is mapping }}{{ t.a.y[0] is number }}', {}),
        ("items of a dict literal", '{% for k, v in {"b": 1, "a": 2}|items %}{{ k }}{{ v }}{% endfor %}|'
                                    '{% for k, v in {"b": 1, "a": 2}.items() %}{{ k }}{{ v }}{% endfor %}|'
                                    '{{ {"b": 1, "a": 2}.keys()|join }}{{ {"b": 1, "a": 2}.values()|join }}', {}),
        ("string plus dict", '{{ "a" + {"b": 1} }}', {}),
        ("string plus int", '{{ "a" + 1 }}', {}),
        ("wordcount and center", '{{ "a b  c"|wordcount }}[{{ "ab"|center(6) }}]', {}),
    ]
    cases = []
    for name, src, variables in probes:
        case = {"name": name, "template": src, "vars": variables}
        try:
            template = env.from_string(src)
        except Exception as e:
            case["error"] = f"{type(e).__name__}: {e}"
        else:
            case.update(render(template, variables))
        cases.append(case)
    return cases


def dump(name, cases):
    """Writes the cases one a line (the tool cases repeat long tool schemas)."""
    head = json.dumps({"jinja2_version": jinja2.__version__, "now": NOW.isoformat()}, ensure_ascii=False)
    lines = [json.dumps(c, ensure_ascii=False) for c in cases]
    with open(name, "w", encoding="utf-8") as f:
        f.write(head[:-1] + ', "cases": [\n' + ",\n".join(lines) + "\n]}\n")
    print(f"{name}: {len(cases)} cases")


def main():
    env = environment()
    dump("jinja_golden.json", jinja_cases(env))
    dump("chat_golden.json", chat_cases(env, "models", MODELS))
    hf = os.environ.get("DRMAS_HF_TOKENIZERS", os.path.join("..", "..", "..", "..", ".cache", "hf-tokenizers"))
    if os.path.isdir(hf):
        dump("hf_golden.json", chat_cases(env, hf, HF_MODELS))
    else:
        print(f"{hf} not installed (scripts/hf-tokenizers.sh): hf_golden.json left as it is")


if __name__ == "__main__":
    main()
