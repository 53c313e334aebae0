// Package tokenizer reads Hugging Face tokenizer.json files of byte-level BPE models (GPT-2,
// Qwen2/2.5/3, Llama 3) with Load, encodes and decodes text with them, builds small byte-level
// tokenizers for toy models (NewCharLevel), and renders chat templates (LoadChatTemplate,
// NewJinjaChatTemplate, BuiltinChatTemplate).
//
// Encoding follows Hugging Face tokenizers: added and special tokens are cut
// out of the text first (longest match), the rest is normalized, split by the
// pre-tokenizer regex, mapped to the byte-level alphabet and merged by BPE
// rank. Encode never adds BOS/EOS or other post-processor tokens: chat
// templates write them into the text, as apply_chat_template does.
//
// Differences from Hugging Face, none of which the Qwen or Llama 3 files
// exercise: added tokens are matched in the raw text whatever their
// "normalized" flag says, "single_word" is ignored (lstrip and rstrip are
// honoured), and only the BPE model, ByteLevel decoder, NFC/NFD/NFKC/NFKD/
// Lowercase normalizers and Split/Digits/ByteLevel pre-tokenizers are
// supported; Load rejects anything else, naming the key.
package tokenizer
