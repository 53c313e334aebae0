#!/usr/bin/env python3
"""Writes pretokenize_golden.json: the pre-tokenizer splits of the GPT-2, Qwen2 and
Llama-3 regexes on a varied text fixture, computed with Python's `regex` module
(Debian: python3-regex). The Go test TestPreTokenizeMatchesPythonRegex compares.

Run from this directory:  python3 gen_pretokenize.py
"""
import json

import regex

PATTERNS = {
    "gpt2": r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    "qwen2": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "llama3": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
}

TEXTS = [
    "Hello world",
    "Hello, world! How are you today?",
    "  leading spaces and trailing spaces   ",
    "I'm sure you're right, they've said it'll work and he'd agree; it's John's.",
    "DON'T SHOUT: I'M HERE, YOU'RE THERE, WE'LL SEE, THEY'VE GONE, HE'D GO, IT'S ON.",
    "Mixed case: I'M, i'm, We'Re, you'Ll, X'S 'tis 'TIS",
    "Numbers: 1 12 123 1234 12345 123456 3.14159 -42 1e10 0x1F 1,000,000",
    "Prices $5.99, €10, £3; 50% off; #1 item @home & co.",
    "Line one\nLine two\r\nLine three\n\n\nAfter blank lines\n",
    "Tabs\tand\t\tmore\ttabs \t mixed \t\n",
    "Trailing newline spaces   \n   next",
    "def f(x):\n    return x ** 2  # square\n\nif __name__ == '__main__':\n    print(f(3))\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "<search>capital of France</search> <answer>Paris</answer>",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "中文文本测试，包括标点符号。然后是更多的文字！",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 텍스트 테스트입니다.",
    "Emoji: 😀😃 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ ✓",
    "Café naïve résumé façade Ångström",
    "Combining: cafe\u0301 e\u0301e\u0300 n\u0303",
    "Ελληνικά και русский текст, עברית, العربية ١٢٣٤٥",
    "हिन्दी पाठ और देवनागरी ४२",
    "ภาษาไทย ทดสอบ",
    "Other digits: ５６７ ² ³ ½ Ⅻ ⅷ ① ٣",
    "Spaces: a\u00a0b\u2003c\u3000d\u2009e\u202ff",
    "Runs of wide spaces: x\u3000\u3000y a\u00a0\u00a0\u00a0b c\u2003\u2003\n d\u2028\u2028e end\u3000\u3000",
    "NEL and friends: a\x85\x85b \x0b\x0b c\x0c\x0cd\u1680\u1680e",
    "Controls: a\x0bb\x0cc\x85d\u2028e\u2029f\x1cg\x1fh\x00i\x7fj",
    "Zero width: a\u200bb\u200dc\ufeffd\u180ee",
    "\n\n\n",
    "   ",
    " ",
    "a",
    "'s",
    "''s ' s 'S'",
    "x'sy's 's's",
    "Case folding: it'ſ IT'ſx he'Kx 'İx 'Sx 'REx 'ǅx",
    "!!! ??? ... --- ***",
    " !!\n\n?? \n",
    "URL: https://example.com/path?q=1&r=two#frag",
    "email me at someone@example.org.",
    "snake_case camelCase PascalCase kebab-case SCREAMING_CASE",
    "1st 2nd 3rd 4th 10x 3D 4K",
    "\\boxed{42} and $\\frac{1}{2}$ and \\sqrt{x^2+y^2}",
    "  \n  \n  indented\n\tindented with tab",
    "end with spaces then letters  abc",
    "multiple   spaces   between   words",
    "\r\r\n\n\r",
    "a \n b \r\n c",
]


def splits(pattern, text):
    """Isolated splits, as Hugging Face's Split pre-tokenizer produces them:
    every match is a piece and so is every gap between matches."""
    out, last = [], 0
    for m in regex.finditer(pattern, text):
        if m.start() > last:
            out.append(text[last:m.start()])
        if m.end() > m.start():
            out.append(m.group(0))
        last = m.end()
    if last < len(text):
        out.append(text[last:])
    return out


def main():
    cases = []
    for text in TEXTS:
        cases.append({
            "text": text,
            "splits": {name: splits(p, text) for name, p in PATTERNS.items()},
        })
    golden = {"regex_version": regex.__version__, "patterns": PATTERNS, "cases": cases}
    with open("pretokenize_golden.json", "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=True, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
