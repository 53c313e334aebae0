// Writes hf_ids.json: token ids and decodes of a varied corpus under the real tokenizer files that
// scripts/hf-tokenizers.sh installs, made by transformers.js's tokenizers (the @lenml/tokenizers
// fork), an independent port of Hugging Face tokenizers. TestRealTokenizers compares.
//
// Run from this directory, with @lenml/tokenizers@3.7.2 installed somewhere:
//   NODE_PATH=/some/dir/node_modules node gen_hf_ids.cjs
const fs = require("fs");
const path = require("path");
const { TokenizerLoader } = require("@lenml/tokenizers");

const root = process.env.DRMAS_HF_TOKENIZERS || path.join("..", "..", "..", "..", ".cache", "hf-tokenizers");
const names = ["qwen2_5", "qwen3", "llama3", "llama3_1", "llama3_2", "deepseek_v3"];
const corpus = [
  "Hello world",
  "Hello, my dog is cute. It's a dog, isn't it? I'm sure we've seen it; they're here!",
  "  leading and trailing spaces  ",
  "tabs\tand\nnewlines\r\n\n\nmany",
  "Numbers: 1234567 3.14159 -42 1e10 2026-12-01",
  "Unicode: héllo wörld 中文字符 日本語 한국어 😀🎉 ñ ß",
  "code: def f(x):\n    return x**2  # square\n",
  "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nok<|im_end|>",
  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
  "<search>capital of France</search> <answer>Paris</answer> <verify>yes</verify>",
  "Don 't , say ' s word . ok ? yes ! n't 'm 've 're",
  "\\boxed{42} $x^2 + y^2 = z^2$",
  "a  b   c    d",
  "",
];

const out = { generator: "@lenml/tokenizers 3.7.2 (transformers.js)", models: {} };
for (const name of names) {
  const dir = path.join(root, name);
  const tokenizer = TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")),
    tokenizerConfig: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8")),
  });
  out.models[name] = corpus.map((text) => {
    const ids = tokenizer.encode(text, { add_special_tokens: false });
    return { text, ids, decoded: ids.length ? tokenizer.decode(ids) : "" };
  });
}
fs.writeFileSync("hf_ids.json", JSON.stringify(out, null, 1) + "\n");
console.log(`hf_ids.json: ${names.length} models x ${corpus.length} texts`);
