package tokenizer

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
)

// TestPreTokenizeMatchesPythonRegex compares the splits of the GPT-2, Qwen2
// and Llama-3 patterns with those Python's `regex` module produced
// (testdata/gen_pretokenize.py writes testdata/pretokenize_golden.json).
func TestPreTokenizeMatchesPythonRegex(t *testing.T) {
	data, err := os.ReadFile("testdata/pretokenize_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var golden struct {
		Patterns map[string]string `json:"patterns"`
		Cases    []struct {
			Text   string              `json:"text"`
			Splits map[string][]string `json:"splits"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(data, &golden); err != nil {
		t.Fatal(err)
	}
	ours := map[string]string{"gpt2": GPT2Pattern, "qwen2": Qwen2Pattern, "llama3": Llama3Pattern}
	if !reflect.DeepEqual(golden.Patterns, ours) {
		t.Fatalf("golden file was made with other patterns:\n got  %q\n want %q", golden.Patterns, ours)
	}
	if len(golden.Cases) < 40 {
		t.Fatalf("golden file has only %d cases", len(golden.Cases))
	}
	for name, pattern := range ours {
		fast, slow := fastAndRegexSplitters(t, pattern)
		for _, c := range golden.Cases {
			want := c.Splits[name]
			for engine, sp := range map[string]*splitter{"fast": fast, "regexp2": slow} {
				if got := pieces(sp, c.Text); !reflect.DeepEqual(got, want) {
					t.Errorf("%s (%s) on %q:\n got (Go)       %q\n want (Python) %q", name, engine, c.Text, got, want)
				}
			}
		}
	}
}

// fastAndRegexSplitters returns the splitter of a known pattern (which uses
// the hand-written matcher) and one that runs the regex.
func fastAndRegexSplitters(t testing.TB, pattern string) (*splitter, *splitter) {
	fast, err := newSplitter(pattern, splitIsolated)
	if err != nil {
		t.Fatal(err)
	}
	if fast.fast == nil {
		t.Fatalf("no hand-written matcher for %q", pattern)
	}
	slow := *fast
	slow.fast = nil
	return fast, &slow
}

func pieces(sp *splitter, s string) []string {
	var out []string
	for _, p := range sp.split(s) {
		out = append(out, s[p.start:p.end])
	}
	return out
}

// TestFastMatchersAgreeWithRegexp2 compares the hand-written matchers with
// regexp2 on random strings over runes of every class the patterns tell
// apart.
func TestFastMatchersAgreeWithRegexp2(t *testing.T) {
	pool := []rune("aZsStTrReEvVmMlLdDſK'' 0123456789٣½Ⅻ\t\n\r\v\f\u0085\u00a0\u2028\u3000.,!?-_#<>|😀中é\u0301\u200d\x00\ufffd")
	seed := uint64(7)
	next := func() uint64 {
		seed = seed*6364136223846793005 + 1442695040888963407
		return seed >> 33
	}
	for _, pattern := range []string{GPT2Pattern, Qwen2Pattern, Llama3Pattern} {
		fast, slow := fastAndRegexSplitters(t, pattern)
		for i := 0; i < 3000; i++ {
			rs := make([]rune, 1+next()%24)
			for j := range rs {
				rs[j] = pool[next()%uint64(len(pool))]
			}
			s := string(rs)
			if got, want := pieces(fast, s), pieces(slow, s); !reflect.DeepEqual(got, want) {
				t.Fatalf("pattern %q on %q:\n fast    %q\n regexp2 %q", pattern, s, got, want)
			}
		}
	}
}

func FuzzFastMatchersAgreeWithRegexp2(f *testing.F) {
	for _, s := range []string{"Hello world", "  x\n\n y ", "it'S 'll 123456", "\xff\xfe 中文!!\r\n"} {
		f.Add(s)
	}
	type pairSp struct{ fast, slow *splitter }
	var sps []pairSp
	for _, pattern := range []string{GPT2Pattern, Qwen2Pattern, Llama3Pattern} {
		fast, slow := fastAndRegexSplitters(f, pattern)
		sps = append(sps, pairSp{fast, slow})
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, p := range sps {
			if got, want := pieces(p.fast, s), pieces(p.slow, s); !reflect.DeepEqual(got, want) {
				t.Fatalf("on %q:\n fast    %q\n regexp2 %q", s, got, want)
			}
		}
	})
}

func TestCutAtBehaviors(t *testing.T) {
	// "a-b--c" with matches on each '-'.
	const s = "a-b--c"
	matches := []span{{1, 2}, {3, 4}, {4, 5}}
	cases := map[splitBehavior][]string{
		splitIsolated:           {"a", "-", "b", "-", "-", "c"},
		splitRemoved:            {"a", "b", "c"},
		splitMergedWithPrevious: {"a-", "b-", "-", "c"},
		splitMergedWithNext:     {"a", "-b", "-", "-c"},
	}
	for b, want := range cases {
		var got []string
		for _, sp := range cutAt(len(s), matches, b) {
			got = append(got, s[sp.start:sp.end])
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("behavior %d: got %q, want %q", b, got, want)
		}
	}
}

func TestSplitKeepsInvalidUTF8Bytes(t *testing.T) {
	sp, err := newSplitter(Qwen2Pattern, splitIsolated)
	if err != nil {
		t.Fatal(err)
	}
	s := "ab\xff\xfe cd\xe4\xb8"
	if joined := strings.Join(pieces(sp, s), ""); joined != s {
		t.Fatalf("pieces join to %q, want %q", joined, s)
	}
}
