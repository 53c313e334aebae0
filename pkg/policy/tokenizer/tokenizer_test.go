package tokenizer

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// gpt2ByteTokens returns the 256 byte tokens in GPT-2's vocabulary order
// (ids 0-255), written out independently of the package's table: printable
// bytes first ('!' is id 0), then the others shifted to U+0100 and up, so
// that space is "Ġ" with id 220 and '\n' is "Ċ" with id 198, as in GPT-2.
func gpt2ByteTokens() []string {
	var bs []int
	for b := '!'; b <= '~'; b++ {
		bs = append(bs, int(b))
	}
	for b := 0xa1; b <= 0xac; b++ {
		bs = append(bs, b)
	}
	for b := 0xae; b <= 0xff; b++ {
		bs = append(bs, b)
	}
	in := map[int]bool{}
	for _, b := range bs {
		in[b] = true
	}
	toks := make([]string, 0, 256)
	for _, b := range bs {
		toks = append(toks, string(rune(b)))
	}
	n := 0
	for b := 0; b < 256; b++ {
		if !in[b] {
			toks = append(toks, string(rune(256+n)))
			n++
		}
	}
	return toks
}

// testMerges are the merges of the test tokenizer, in rank order. Merged
// tokens get ids 256.. in this order: Ġw 256, or 257, ll 258, Ġwor 259,
// He 260, Hell 261, Hello 262, ld 263, Ġworld 264, 12 265.
var testMerges = [][2]string{
	{"Ġ", "w"}, {"o", "r"}, {"l", "l"}, {"Ġw", "or"}, {"H", "e"},
	{"He", "ll"}, {"Hell", "o"}, {"l", "d"}, {"Ġwor", "ld"}, {"1", "2"},
}

// testTokenizerJSON writes a GPT-2-style tokenizer.json. preTokenizer is the
// raw pre_tokenizer section; legacyMerges selects the "a b" merge format.
// Added tokens: <|endoftext|> 266 (special), <tag> 267 (not special); with
// extraVocab, "lld" is vocabulary token 268 that no merge produces.
func testTokenizerJSON(preTokenizer, normalizer string, legacyMerges, ignoreMerges, extraVocab bool) []byte {
	var vocab []string
	vocab = append(vocab, gpt2ByteTokens()...)
	var merges []any
	for _, m := range testMerges {
		vocab = append(vocab, m[0]+m[1])
		if legacyMerges {
			merges = append(merges, m[0]+" "+m[1])
		} else {
			merges = append(merges, []string{m[0], m[1]})
		}
	}
	vocabJSON := map[string]int{}
	for i, v := range vocab {
		vocabJSON[v] = i
	}
	if extraVocab {
		vocabJSON["lld"] = 268
	}
	doc := map[string]any{
		"version":    "1.0",
		"truncation": nil,
		"padding":    nil,
		"added_tokens": []map[string]any{
			{"id": 266, "content": "<|endoftext|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
			{"id": 267, "content": "<tag>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": false},
		},
		"normalizer":     json.RawMessage(normalizer),
		"pre_tokenizer":  json.RawMessage(preTokenizer),
		"post_processor": nil,
		"decoder":        map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{
			"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": "",
			"end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false,
			"ignore_merges": ignoreMerges, "vocab": vocabJSON, "merges": merges,
		},
	}
	data, err := json.Marshal(doc)
	if err != nil {
		panic(err)
	}
	return data
}

const (
	gpt2PreTokenizer = `{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true}`
	qwenPreTokenizer = `{"type":"Sequence","pretokenizers":[` +
		`{"type":"Split","pattern":{"Regex":"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},"behavior":"Isolated","invert":false},` +
		`{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":false}]}`
)

func mustParse(t *testing.T, data []byte) *Tokenizer {
	t.Helper()
	tok, err := parse(data)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestGoldenIDs checks ids derived by hand from the merges above. Byte ids
// follow GPT-2: '!' 0 … 'H' 39, 'd' 67, 'e' 68, 'l' 75, 'o' 78, 'r' 81,
// 'w' 86; "Ċ" ('\n') 198; "Ġ" (space) 220; é = C3 A9 -> 127 102.
func TestGoldenIDs(t *testing.T) {
	cases := []struct {
		text string
		want []int
		why  string
	}{
		{"Hello world", []int{262, 264}, "H e l l o: ll(rank 2) first, then He, Hell, Hello; Ġ w o r l d: Ġw, or, Ġwor, ld, Ġworld"},
		{"lld", []int{258, 67}, "ll (rank 2) beats ld (rank 7)"},
		{"llll", []int{258, 258}, "equal ranks merge leftmost first"},
		{"lll", []int{258, 75}, "leftmost pair merges, the third l stays"},
		{"Hel", []int{260, 75}, "He, then (He,l) is no merge"},
		{"world", []int{86, 257, 263}, "no leading space: w, or, ld"},
		{" world!", []int{264, 0}, "'!' is its own pre-token"},
		{"Hello\n", []int{262, 198}, "newline byte"},
		{"é", []int{127, 102}, "two bytes, no merges"},
		{"Hello<|endoftext|> world", []int{262, 266, 264}, "special token split out of the text"},
		{"<tag>Hello</tag>", []int{267, 262, 27, 14, 83, 64, 70, 29}, "added tag; '</tag>' is not a token: '<' 27, '/' 14, 't' 83, 'a' 64, 'g' 70, '>' 29"},
		{"<|endoftext|><|endoftext|>", []int{266, 266}, "adjacent specials"},
		{"", []int{}, "empty"},
	}
	for _, legacy := range []bool{true, false} {
		tok := mustParse(t, testTokenizerJSON(gpt2PreTokenizer, "null", legacy, false, false))
		for _, c := range cases {
			got := tok.Encode(c.text)
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("legacy=%v Encode(%q) = %v, want %v (%s)", legacy, c.text, got, c.want, c.why)
			}
			if dec := tok.Decode(c.want); dec != c.text {
				t.Errorf("Decode(%v) = %q, want %q", c.want, dec, c.text)
			}
		}
	}
}

func TestQwenStyleSplitAndDigits(t *testing.T) {
	gpt2 := mustParse(t, testTokenizerJSON(gpt2PreTokenizer, "null", false, false, false))
	qwen := mustParse(t, testTokenizerJSON(qwenPreTokenizer, `{"type":"NFC"}`, false, false, false))
	// GPT-2 keeps "12" as one pre-token, so the merge applies; Qwen's \p{N}
	// splits digits apart, so it cannot.
	if got := gpt2.Encode("12"); !reflect.DeepEqual(got, []int{265}) {
		t.Errorf("gpt2 Encode(12) = %v, want [265]", got)
	}
	if got := qwen.Encode("12"); !reflect.DeepEqual(got, []int{16, 17}) {
		t.Errorf("qwen Encode(12) = %v, want [16 17]", got)
	}
	if got := qwen.Encode("Hello world"); !reflect.DeepEqual(got, []int{262, 264}) {
		t.Errorf("qwen Encode(Hello world) = %v, want [262 264]", got)
	}
	// NFC: e + U+0301 composes to é (C3 A9) before byte-level mapping.
	if got := qwen.Encode("e\u0301"); !reflect.DeepEqual(got, []int{127, 102}) {
		t.Errorf("qwen Encode(e+U+0301) = %v, want [127 102] (NFC é)", got)
	}
}

func TestIgnoreMerges(t *testing.T) {
	on := mustParse(t, testTokenizerJSON(gpt2PreTokenizer, "null", false, true, true))
	off := mustParse(t, testTokenizerJSON(gpt2PreTokenizer, "null", false, false, true))
	if got := on.Encode("lld"); !reflect.DeepEqual(got, []int{268}) {
		t.Errorf("ignore_merges Encode(lld) = %v, want [268]", got)
	}
	if got := off.Encode("lld"); !reflect.DeepEqual(got, []int{258, 67}) {
		t.Errorf("Encode(lld) = %v, want [258 67]", got)
	}
}

func TestAccessors(t *testing.T) {
	tok := mustParse(t, testTokenizerJSON(gpt2PreTokenizer, "null", false, false, false))
	if got := tok.VocabSize(); got != 268 {
		t.Errorf("VocabSize = %d, want 268", got)
	}
	for s, want := range map[string]int{"<|endoftext|>": 266, "<tag>": 267, "Ġworld": 264, "Ġ": 220} {
		if id, ok := tok.TokenID(s); !ok || id != want {
			t.Errorf("TokenID(%q) = %d, %v; want %d", s, id, ok, want)
		}
	}
	if _, ok := tok.TokenID("nope"); ok {
		t.Error("TokenID(nope) found")
	}
	if tok.IDToken(264) != "Ġworld" || tok.IDToken(266) != "<|endoftext|>" || tok.IDToken(9999) != "" {
		t.Errorf("IDToken: %q %q %q", tok.IDToken(264), tok.IDToken(266), tok.IDToken(9999))
	}
	if !tok.IsSpecial(266) || tok.IsSpecial(267) || tok.IsSpecial(262) {
		t.Error("IsSpecial: want only <|endoftext|> special")
	}
}

func TestDecodeInvalidUTF8LikeHF(t *testing.T) {
	tok := mustParse(t, testTokenizerJSON(gpt2PreTokenizer, "null", false, false, false))
	// 中 = E4 B8 AD; byte ids E4 -> 160, B8 -> 116, AD -> 255, C0 -> 124.
	cases := []struct {
		ids  []int
		want string
	}{
		{[]int{160, 116, 255}, "中"},
		{[]int{160, 116}, "\uFFFD"},             // truncated: one maximal subpart
		{[]int{160, 116, 39}, "\uFFFDH"},        // truncated, then ASCII
		{[]int{255}, "\uFFFD"},                  // lone continuation byte
		{[]int{255, 255}, "\uFFFD\uFFFD"},       // each stray byte its own U+FFFD
		{[]int{124, 66}, "\uFFFDc"},             // C0 never starts a sequence
		{[]int{262, 9999, 264}, "Hello world"},  // unknown id skipped
		{[]int{266, 262}, "<|endoftext|>Hello"}, // special kept
	}
	for _, c := range cases {
		if got := tok.Decode(c.ids); got != c.want {
			t.Errorf("Decode(%v) = %q, want %q", c.ids, got, c.want)
		}
	}
}

func TestLoadErrorsNameTheProblem(t *testing.T) {
	good := string(testTokenizerJSON(gpt2PreTokenizer, "null", false, false, false))
	cases := map[string]struct{ doc, want string }{
		"unigram":  {strings.Replace(good, `"type":"BPE"`, `"type":"Unigram"`, 1), `model.type "Unigram"`},
		"decoder":  {strings.Replace(good, `"decoder":{"add_prefix_space":true,"trim_offsets":true,"type":"ByteLevel","use_regex":true}`, `"decoder":{"type":"Metaspace"}`, 1), `decoder: type "Metaspace"`},
		"pre":      {strings.Replace(good, `"pre_tokenizer":{"type":"ByteLevel"`, `"pre_tokenizer":{"type":"Whitespace"`, 1), `"Whitespace"`},
		"merge":    {strings.Replace(good, `["Ġ","w"]`, `["Ġ","zz"]`, 1), `model.merges[0]`},
		"badMerge": {strings.Replace(good, `["Ġ","w"]`, `"Ġw"`, 1), `merges[0]`},
	}
	for name, c := range cases {
		if c.doc == good {
			t.Fatalf("%s: replacement did not apply", name)
		}
		_, err := parse([]byte(c.doc))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want it to mention %s", name, err, c.want)
		}
	}
}

func TestCharLevelSaveLoad(t *testing.T) {
	tags := []string{"<search>", "</search>", "<answer>", "</answer>", "<verify>", "</verify>", "<information>", "</information>", "<search>"}
	tok := NewCharLevel(tags, []string{"<pad>"})
	path := t.TempDir() + "/tokenizer.json"
	if err := tok.Save(path); err != nil {
		t.Fatal(err)
	}
	loaded, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	// 256 bytes, 3 ChatML specials, <pad>, 8 distinct tags.
	if got := loaded.VocabSize(); got != 256+3+1+8 {
		t.Errorf("VocabSize = %d, want 268", got)
	}
	want := map[string]int{EndOfText: 256, ImStart: 257, ImEnd: 258, "<pad>": 259, "<search>": 260, "</search>": 261, "</information>": 267}
	for s, id := range want {
		if got, ok := loaded.TokenID(s); !ok || got != id {
			t.Errorf("TokenID(%q) = %d, %v; want %d", s, got, ok, id)
		}
	}
	if !loaded.IsSpecial(258) || loaded.IsSpecial(260) {
		t.Error("ChatML tokens must be special, tags not")
	}
	text := "<|im_start|>assistant\n<search>key 7</search><|im_end|>"
	ids := loaded.Encode(text)
	wantIDs := []int{257}
	for _, b := range []byte("assistant\n") {
		wantIDs = append(wantIDs, int(b))
	}
	wantIDs = append(wantIDs, 260, 'k', 'e', 'y', ' ', '7', 261, 258)
	if !reflect.DeepEqual(ids, wantIDs) {
		t.Errorf("Encode = %v\nwant     %v", ids, wantIDs)
	}
	if !reflect.DeepEqual(tok.Encode(text), ids) {
		t.Error("saved and loaded tokenizers encode differently")
	}
	if got := loaded.Decode(ids); got != text {
		t.Errorf("Decode = %q, want %q", got, text)
	}
}

func TestCharLevelFileIsHFShaped(t *testing.T) {
	path := t.TempDir() + "/tokenizer.json"
	if err := NewCharLevel([]string{"<answer>"}, nil).Save(path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"content": "<|im_end|>"`) {
		t.Error(`tokenizer.json does not spell "<|im_end|>" plainly`)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer", "post_processor", "decoder", "model"} {
		if _, ok := doc[k]; !ok {
			t.Errorf("tokenizer.json lacks %q", k)
		}
	}
	model := doc["model"].(map[string]any)
	if model["type"] != "BPE" || len(model["vocab"].(map[string]any)) != 256 || len(model["merges"].([]any)) != 0 {
		t.Errorf("model = type %v, %d vocab, merges %v", model["type"], len(model["vocab"].(map[string]any)), model["merges"])
	}
	if v := model["vocab"].(map[string]any)["Ġ"]; v != float64(32) {
		t.Errorf(`vocab["Ġ"] = %v, want 32 (the space byte)`, v)
	}
}

// roundTripTokenizers are the tokenizers the round-trip tests run through.
func roundTripTokenizers(t testing.TB) map[string]*Tokenizer {
	out := map[string]*Tokenizer{"charlevel": NewCharLevel([]string{"<search>"}, nil)}
	for name, pre := range map[string]string{"gpt2": gpt2PreTokenizer, "qwen": qwenPreTokenizer} {
		tok, err := parse(testTokenizerJSON(pre, "null", false, false, false))
		if err != nil {
			t.Fatal(err)
		}
		out[name] = tok
	}
	return out
}

// checkRoundTrip checks that every tokenizer gives back s byte for byte
// (and as text, when s is valid UTF-8). Text holding an added token's
// content is skipped: that content encodes to the token, by design.
func checkRoundTrip(t testing.TB, toks map[string]*Tokenizer, s string) {
	for _, added := range []string{EndOfText, ImStart, ImEnd, "<tag>", "<search>"} {
		if strings.Contains(s, added) {
			return
		}
	}
	for name, tok := range toks {
		ids := tok.Encode(s)
		if got := string(tok.DecodeBytes(ids)); got != s {
			t.Fatalf("%s: DecodeBytes(Encode(%q)) = %q", name, s, got)
		}
		if utf8.ValidString(s) {
			if got := tok.Decode(ids); got != s {
				t.Fatalf("%s: Decode(Encode(%q)) = %q", name, s, got)
			}
		}
	}
}

func FuzzRoundTrip(f *testing.F) {
	for _, s := range []string{
		"", "Hello world", "  x  \n\n\ty", "I'M here, it's 12:30.", "中文，日本語。", "👨‍👩‍👧 🇫🇷",
		"e\u0301", "a\x00b\x7f", "\xff\xfe", "\xe4\xb8", "<|endoftext", "def f():\n    return 1\n",
	} {
		f.Add(s)
	}
	toks := roundTripTokenizers(f)
	f.Fuzz(func(t *testing.T, s string) {
		checkRoundTrip(t, toks, s)
	})
}

// TestRoundTripRandomText runs the round trip on random strings drawn from
// a pool of runes that exercise every regex branch.
func TestRoundTripRandomText(t *testing.T) {
	pool := []rune("aZé'sStTdDmlLvVrReE 0123456789\t\n\r\u00a0\u3000.,!?-_#<>|/\\中文日本語한국어😀👍🏽\u200d\u0301\u0085\x0b")
	toks := roundTripTokenizers(t)
	seed := uint64(1)
	for i := 0; i < 2000; i++ {
		var sb strings.Builder
		seed = seed*6364136223846793005 + 1442695040888963407
		n := int(seed>>58) + 1
		for j := 0; j < n; j++ {
			seed = seed*6364136223846793005 + 1442695040888963407
			sb.WriteRune(pool[int(seed>>33)%len(pool)])
		}
		checkRoundTrip(t, toks, sb.String())
	}
}
