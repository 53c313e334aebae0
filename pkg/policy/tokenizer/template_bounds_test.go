package tokenizer

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Chat templates too large or nested too deep are refused before gonja parses them, within a
// second, with an error naming the file (before: 100,000 nested parentheses overflowed Go's stack,
// which killed the process at --dry-run, train or serve start-up; a 4.4 MB nested template took 77 s
// to parse). Both places a template comes from are checked: tokenizer_config.json's chat_template
// and chat_template.jinja.
func TestHugeOrDeepTemplatesRefused(t *testing.T) {
	const deep = 100_000
	cases := map[string]string{
		"100,000 nested parentheses": "{{ " + strings.Repeat("(", deep) + "1" + strings.Repeat(")", deep) + " }}",
		"100,000 nested brackets":    "{{ " + strings.Repeat("[", deep) + "1" + strings.Repeat("]", deep) + " }}",
		"100,000 nested dicts":       "{{ " + strings.Repeat("{'a': ", deep) + "1" + strings.Repeat("}", deep) + " }}",
		"100,000 nested ifs":         strings.Repeat("{% if true %}", deep) + "x" + strings.Repeat("{% endif %}", deep),
		"100,000 nested fors":        strings.Repeat("{% for m in messages %}", deep) + "x" + strings.Repeat("{% endfor %}", deep),
		"100,000 nots":               "{{ " + strings.Repeat("not ", deep) + "true }}",
		"100,000 minus signs":        "{{ " + strings.Repeat("-", deep) + "1 }}",
		"10,000 nested ifs (240 KB)": strings.Repeat("{% if true %}", 10_000) + "x" + strings.Repeat("{% endif %}", 10_000),
		"60,000 nots (240 KB)":       "{{ " + strings.Repeat("not ", 60_000) + "true }}",
		"30,000 nested dicts":        "{{ " + strings.Repeat("{'a': ", 30_000) + "1" + strings.Repeat("}", 30_000) + " }}",
		"10 MB":                      strings.Repeat("{{ messages[0]['content'] }}\n", 10<<20/30),
		"4.4 MB nested":              strings.Repeat("{% if true %}"+strings.Repeat("(", 40), 1) + strings.Repeat("{{ (((((1))))) }}", 4400<<10/17),
	}
	for name, src := range cases {
		for _, form := range []string{"tokenizer_config.json", "chat_template.jinja"} {
			dir := t.TempDir()
			var file string
			if form == "chat_template.jinja" {
				file = filepath.Join(dir, "chat_template.jinja")
				os.WriteFile(file, []byte(src), 0o644)
				os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"eos_token": "</s>"}`), 0o644)
			} else {
				file = filepath.Join(dir, "tokenizer_config.json")
				data, _ := json.Marshal(map[string]any{"chat_template": src, "eos_token": "</s>"})
				os.WriteFile(file, data, 0o644)
			}
			began := time.Now()
			_, err := LoadChatTemplate(dir)
			took := time.Since(began)
			var be *TemplateBoundsError
			if err == nil || !errors.As(err, &be) || !strings.Contains(err.Error(), file) {
				t.Errorf("%s in %s: %v, want a refusal naming %s", name, form, err, file)
				continue
			}
			if took > time.Second {
				t.Errorf("%s in %s: refused after %v, want under a second", name, form, took)
			}
			t.Logf("%s in %s: refused in %v: %v", name, form, took.Round(time.Microsecond), strings.TrimPrefix(err.Error(), dir))
		}
	}
}

// The real templates of the test models (Qwen2.5, Qwen3, Llama 3 / 3.1, Mistral, DeepSeek-R1
// distills, ...) are well inside the bounds, and a template just inside them still compiles.
func TestRealTemplatesWithinBounds(t *testing.T) {
	dirs, _ := filepath.Glob("testdata/models/*")
	if len(dirs) < 5 {
		t.Fatalf("%d test models", len(dirs))
	}
	for _, dir := range dirs {
		cfg, err := readTokenizerConfig(filepath.Join(dir, "tokenizer_config.json"))
		if err != nil {
			t.Fatal(err)
		}
		src, _, err := findTemplateSource(dir, cfg)
		if err != nil || src == "" {
			t.Fatalf("%s: no template (%v)", dir, err)
		}
		if err := checkTemplateBounds(src); err != nil {
			t.Errorf("%s: %v", dir, err)
		}
		if _, err := LoadChatTemplate(dir); err != nil {
			t.Errorf("%s: %v", dir, err)
		}
	}
	edge := strings.Repeat("{% if true %}", maxSourceDepth) + "{{ " + strings.Repeat("(", maxSourceDepth) + "1" + strings.Repeat(")", maxSourceDepth) + " }}" + strings.Repeat("{% endif %}", maxSourceDepth)
	if _, err := compileJinja(edge, "", ""); err != nil {
		t.Errorf("a template nested exactly %d deep: %v", maxSourceDepth, err)
	}
	if err := checkTemplateBounds("{{ " + strings.Repeat("(", maxSourceDepth+1) + "1" + strings.Repeat(")", maxSourceDepth+1) + " }}"); err == nil {
		t.Errorf("a template nested %d deep passed", maxSourceDepth+1)
	}
	// Brackets, end tags and comment markers inside strings, comments and raw blocks are text.
	text := `{# ((((( {% if %} #}{{ '(((((' ~ "[[[[[" }}{% raw %}{% if %}((((({% endraw %}{% set x = '{%' %}`
	text = strings.Repeat(text, maxSourceDepth+1)
	if err := checkTemplateBounds(text); err != nil {
		t.Errorf("brackets in strings, comments and raw blocks counted: %v", err)
	}
}

// Flat chains under the size bound ({{ 1+1+…+1 }}, {{ x.a.a.a… }}) are refused in well under a
// second with a message naming the bound: gonja's tree for a chain is as deep as the chain is long,
// and rendering one that fails (an undefined attribute) took time growing faster than its square
// (x.a… of 2,000 links: 4 s per render; 20,000: beyond minutes), at load (the probe renders) and at
// every prompt. A chain at the bound still compiles.
func TestLongChainsRefused(t *testing.T) {
	cases := map[string]string{
		"20,000 additions":                 "{{ 1" + strings.Repeat("+1", 20_000) + " }}",
		"4,000 attributes":                 "{{ x" + strings.Repeat(".a", 4_000) + " }}",
		"20,000 attributes":                "{{ x" + strings.Repeat(".a", 20_000) + " }}",
		"20,000 subscripts":                "{{ x" + strings.Repeat("['a']", 20_000) + " }}",
		"20,000 filters":                   "{{ 'a'" + strings.Repeat("|string", 20_000) + " }}",
		"20,000 ands":                      "{{ x" + strings.Repeat(" and x", 20_000) + " }}",
		"a set of 20,000 concatenations":   "{% set s = 'a'" + strings.Repeat(" ~ 'a'", 20_000) + " %}{{ s }}",
		"messages[0] and 4,000 attributes": "{{ messages[0]" + strings.Repeat(".a", 4_000) + " }}",
	}
	for name, src := range cases {
		dir := t.TempDir()
		data, _ := json.Marshal(map[string]any{"chat_template": src, "eos_token": "</s>"})
		os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), data, 0o644)
		began := time.Now()
		_, err := LoadChatTemplate(dir)
		took := time.Since(began)
		var be *TemplateBoundsError
		if err == nil || !errors.As(err, &be) || !strings.Contains(err.Error(), "more than 256 operators in one tag") {
			t.Errorf("%s: %v after %v, want a refusal naming the bound", name, err, took)
			continue
		}
		if took > time.Second {
			t.Errorf("%s: refused after %v, want under a second", name, took)
		}
	}
	at := "{{ x" + strings.Repeat(".a", 256) + " }}"
	if _, err := compileJinja(at, "", ""); err != nil {
		t.Errorf("a chain of 256 operators: %v", err)
	}
}
