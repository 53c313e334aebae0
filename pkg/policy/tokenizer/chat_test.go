package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drmas/drmas/pkg/llm"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// chatGolden is a golden file written by testdata/gen_chat.py.
type chatGolden struct {
	Now   string `json:"now"`
	Cases []struct {
		Model               string    `json:"model"`
		Name                string    `json:"name"`
		AddGenerationPrompt bool      `json:"add_generation_prompt"`
		Messages            []Message `json:"messages"`
		// Kwargs reach RenderWith as raw JSON, so that a tool schema's
		// keys keep the order Python's dicts keep.
		Kwargs map[string]json.RawMessage `json:"kwargs"`
		Want   *string                    `json:"want"`
		Error  string                     `json:"error"`
	} `json:"cases"`
}

// readGolden reads a golden file and pins strftime_now's clock to the time
// its renders were made with.
func readGolden(t *testing.T, path string, into any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var head struct {
		Now string `json:"now"`
	}
	if err := json.Unmarshal(data, &head); err != nil || head.Now == "" {
		t.Fatalf("%s: no \"now\" (%v)", path, err)
	}
	now, err := time.Parse("2006-01-02T15:04:05", head.Now)
	if err != nil {
		t.Fatal(err)
	}
	saved := clock
	clock = func() time.Time { return now }
	t.Cleanup(func() { clock = saved })
}

// pyMap is a JSON object decoded as Python's json module decodes it: 1
// stays an int (Go would make it a float64, which templates print "1.0").
type pyMap map[string]any

// UnmarshalJSON implements json.Unmarshaler.
func (m *pyMap) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var raw map[string]any
	if err := dec.Decode(&raw); err != nil {
		return err
	}
	*m = pythonNumbers(raw).(map[string]any)
	return nil
}

// pythonNumbers turns the JSON integers under v into intValue.
func pythonNumbers(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = pythonNumbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = pythonNumbers(e)
		}
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return int(i)
		}
		f, _ := x.Float64()
		return f
	}
	return v
}

// rawKwargs hands a golden case's template arguments to RenderWith as
// json.RawMessage values (nil for none).
func rawKwargs(raw map[string]json.RawMessage) map[string]any {
	if raw == nil {
		return nil
	}
	out := make(map[string]any, len(raw))
	for k, v := range raw {
		out[k] = v
	}
	return out
}

// kwargNames lists the names of a case's template arguments, with the value
// of the short ones, for test labels.
func kwargNames(raw map[string]json.RawMessage) string {
	var parts []string
	for k, v := range raw {
		if len(v) > 24 {
			v = json.RawMessage("…")
		}
		parts = append(parts, k+"="+string(v))
	}
	slices.Sort(parts)
	return "{" + strings.Join(parts, " ") + "}"
}

// checkChatGolden renders every case of a golden file with the template of
// dir(case.model) and compares with jinja2's render (or its error).
func checkChatGolden(t *testing.T, golden *chatGolden, dir func(model string) string) map[string]*ChatTemplate {
	t.Helper()
	templates := map[string]*ChatTemplate{}
	for _, c := range golden.Cases {
		ct, ok := templates[c.Model]
		if !ok {
			var err error
			ct, err = LoadChatTemplate(dir(c.Model))
			if err != nil {
				t.Fatal(err)
			}
			if ct.Name() != "jinja" {
				t.Fatalf("%s: got built-in %q, want the model's own template rendered by gonja", c.Model, ct.Name())
			}
			templates[c.Model] = ct
		}
		kwargs := rawKwargs(c.Kwargs)
		label := fmt.Sprintf("%s / %s / gen=%v / kwargs=%s", c.Model, c.Name, c.AddGenerationPrompt, kwargNames(c.Kwargs))
		got, err := ct.RenderWith(c.Messages, c.AddGenerationPrompt, kwargs)
		switch {
		case c.Want == nil && err == nil:
			t.Errorf("%s: rendered %q, want an error like jinja2's %q", label, got, c.Error)
		case c.Want == nil:
			if msg := strings.TrimPrefix(c.Error, "TemplateError: "); msg != c.Error && !strings.Contains(err.Error(), msg) {
				t.Errorf("%s: error %q, want it to carry jinja2's %q", label, err, msg)
			}
		case err != nil:
			t.Errorf("%s: %v", label, err)
		case got != *c.Want:
			t.Errorf("%s:\n got (gonja)  %q\n want (jinja2) %q", label, got, *c.Want)
		}
	}
	return templates
}

// TestChatTemplatesMatchJinja2 renders the real Qwen2.5, Qwen3, Llama 3,
// Llama 3.1, Mistral, Mistral Small 3.1 and DeepSeek-R1-Distill templates
// (testdata/models) with gonja and compares with Python jinja2's renders,
// made the way transformers makes them (testdata/gen_chat.py), template
// arguments and the errors templates raise included.
func TestChatTemplatesMatchJinja2(t *testing.T) {
	var golden chatGolden
	readGolden(t, "testdata/chat_golden.json", &golden)
	if len(golden.Cases) != 482 {
		t.Fatalf("golden file has %d cases, want 482", len(golden.Cases))
	}
	templates := checkChatGolden(t, &golden, func(m string) string { return filepath.Join("testdata/models", m) })
	want := map[string][]string{"qwen2.5": {ImEnd}, "qwen3": {ImEnd}, "llama3": {llama3EOT}, "llama3.1": {llama3EOT}, "multiline": {"</s>"}}
	for model, eot := range want {
		if got := templates[model].EndOfTurn(); !reflect.DeepEqual(got, eot) {
			t.Errorf("%s EndOfTurn = %q, want %q", model, got, eot)
		}
	}
}

// jinjaGaps are the probes where gonja still differs from jinja2, and why.
// None of the chat templates tested here depends on them; the test fails
// when one starts to match, so the list stays true.
var jinjaGaps = map[string]string{
	"default filter":                "None and undefined are both Go nil: default() replaces None too",
	"dict access":                   "None prints as empty, not \"None\"",
	"dict methods":                  "None prints as empty, not \"None\"",
	"tests":                         "None is not defined (jinja2: defined)",
	"none and bools printed":        "None prints as empty, not \"None\"",
	"arithmetic":                    "** gives a float; // on negatives truncates",
	"content none":                  "None prints as empty, not \"None\"",
	"items loop on message":         "a Go map the caller passes has no key order: its items come sorted (JSON decoded for the rendering keeps its order)",
	"string iteration":              "a for loop over a string walks bytes, not characters",
	"truthiness":                    "an empty dict is true",
	"unknown escape":                "gonja's parser rejects an unknown escape such as \\q (Python keeps it)",
	"literal ending in a backslash": "gonja's lexer does not end a string at \\\\\"",
}

// TestJinjaSemanticsMatchJinja2 runs small templates probing what chat
// templates rely on (negative indices, slices, string methods, filters,
// tests, loops, namespaces, raise_exception, strftime_now) against jinja2's
// renders of the same templates.
func TestJinjaSemanticsMatchJinja2(t *testing.T) {
	var golden struct {
		Cases []struct {
			Name     string  `json:"name"`
			Template string  `json:"template"`
			Vars     pyMap   `json:"vars"`
			Want     *string `json:"want"`
			Error    string  `json:"error"`
		} `json:"cases"`
	}
	readGolden(t, "testdata/jinja_golden.json", &golden)
	if len(golden.Cases) < 50 {
		t.Fatalf("golden file has %d cases, want at least 50", len(golden.Cases))
	}
	for _, c := range golden.Cases {
		if reason, ok := jinjaGaps[c.Name]; ok {
			j, err := compileJinja(c.Template, "", "")
			if err == nil {
				var got string
				if got, err = j.tpl.ExecuteToString(exec.NewContext(c.Vars)); err == nil && c.Want != nil && got == *c.Want {
					t.Errorf("%s: now matches jinja2: remove it from jinjaGaps", c.Name)
				}
			}
			t.Logf("known gap: %s: %s", c.Name, reason)
			continue
		}
		j, err := compileJinja(c.Template, "", "")
		var got string
		if err == nil {
			got, err = j.tpl.ExecuteToString(exec.NewContext(c.Vars))
		}
		switch {
		case c.Want == nil && err == nil:
			t.Errorf("%s: rendered %q, want an error like jinja2's %q", c.Name, got, c.Error)
		case c.Want == nil:
		case err != nil:
			t.Errorf("%s: %s: %v", c.Name, c.Template, err)
		case got != *c.Want:
			t.Errorf("%s: %s\n got (gonja)  %q\n want (jinja2) %q", c.Name, c.Template, got, *c.Want)
		}
	}
}

// TestBuiltinsMatchRealTemplates checks the built-ins against the real
// templates on conversations where they should agree: chatml = Qwen2.5 with
// a system message, qwen3 = Qwen3 (with enable_thinking either way),
// llama3 = Llama 3.
func TestBuiltinsMatchRealTemplates(t *testing.T) {
	conv := []Message{
		{Role: "system", Content: "You are the Searcher."},
		{Role: "user", Content: "Find the key for 7."},
		{Role: "assistant", Content: "<search>key 7</search>"},
		{Role: "user", Content: "<information>key 7 is 3</information>"},
	}
	for builtin, model := range map[string]string{TemplateChatML: "qwen2.5", TemplateQwen3: "qwen3", TemplateLlama3: "llama3"} {
		real, err := LoadChatTemplate(filepath.Join("testdata/models", model))
		if err != nil {
			t.Fatal(err)
		}
		b, err := BuiltinChatTemplate(builtin, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, gen := range []bool{true, false} {
			for _, think := range []bool{false, true} {
				kw := map[string]any{"enable_thinking": think}
				want, err := real.RenderWith(conv, gen, kw)
				if err != nil {
					t.Fatal(err)
				}
				got, _ := b.RenderWith(conv, gen, kw)
				if got != want {
					t.Errorf("%s vs %s (gen=%v, enable_thinking=%v):\n got  %q\n want %q", builtin, model, gen, think, got, want)
				}
			}
		}
	}
}

func TestBuiltinRenders(t *testing.T) {
	conv := []Message{{Role: "system", Content: "S"}, {Role: "user", Content: "U"}}
	cases := []struct {
		name string
		want string
		eot  []string
	}{
		{TemplateChatML, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n", []string{ImEnd, "</s>"}},
		{TemplateQwen3, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", []string{ImEnd, "</s>"}},
		{TemplateLlama3, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n", []string{llama3EOT, "</s>"}},
		{TemplatePlain, "system: S\nuser: U\nassistant: ", []string{"</s>"}},
	}
	for _, c := range cases {
		ct, err := BuiltinChatTemplate(c.name, "</s>")
		if err != nil {
			t.Fatal(err)
		}
		got, err := ct.Render(conv, true)
		if err != nil || got != c.want {
			t.Errorf("%s: got %q, %v; want %q", c.name, got, err, c.want)
		}
		if !reflect.DeepEqual(ct.EndOfTurn(), c.eot) {
			t.Errorf("%s EndOfTurn = %q, want %q", c.name, ct.EndOfTurn(), c.eot)
		}
	}
	if _, err := BuiltinChatTemplate("vicuna", ""); err == nil {
		t.Error("unknown built-in accepted")
	}
}

func writeFile(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadChatTemplateForms(t *testing.T) {
	// A list of named templates with an AddedToken-object eos_token.
	dir := t.TempDir()
	writeFile(t, dir, "tokenizer_config.json", `{
		"chat_template": [
			{"name": "tool_use", "template": "TOOLS"},
			{"name": "default", "template": "{% for m in messages %}[{{ m.role }}]{{ m['content'] }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"}
		],
		"eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": false},
		"bos_token": "<s>"
	}`)
	ct, err := LoadChatTemplate(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ct.Render([]Message{{Role: "user", Content: "hi"}}, true)
	if want := "[user]hi</s>[assistant]"; err != nil || got != want {
		t.Errorf("list form: got %q, %v; want %q", got, err, want)
	}
	if !reflect.DeepEqual(ct.EndOfTurn(), []string{"</s>"}) {
		t.Errorf("EndOfTurn = %q", ct.EndOfTurn())
	}

	// chat_template.jinja beside a config without one.
	dir = t.TempDir()
	writeFile(t, dir, "tokenizer_config.json", `{"eos_token": "<|im_end|>"}`)
	writeFile(t, dir, "chat_template.jinja", "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}")
	ct, err = LoadChatTemplate(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, _ = ct.Render([]Message{{Role: "user", Content: "x"}}, false)
	if want := "<|im_start|>user\nx<|im_end|>\n"; got != want {
		t.Errorf("chat_template.jinja: got %q, want %q", got, want)
	}

	// raise_exception surfaces as an error; a template that refuses system
	// turns still loads.
	dir = t.TempDir()
	writeFile(t, dir, "tokenizer_config.json", `{"chat_template": "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok"}`)
	ct, err = LoadChatTemplate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if ct.Name() != "jinja" {
		t.Errorf("template that refuses system turns: got %q, want jinja", ct.Name())
	}
	if _, err := ct.Render([]Message{{Role: "system"}}, false); err == nil || !strings.Contains(err.Error(), "first must be user") {
		t.Errorf("raise_exception: err = %v", err)
	}
	if out, err := ct.Render([]Message{{Role: "user"}}, false); err != nil || out != "ok" {
		t.Errorf("got %q, %v; want ok", out, err)
	}
}

func TestLoadChatTemplateFallbacks(t *testing.T) {
	// No template at all: the tokenizer's tokens pick the built-in.
	dir := t.TempDir()
	if err := NewCharLevel([]string{"<search>"}, nil).Save(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	ct, err := LoadChatTemplate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if ct.Name() != TemplateChatML || !reflect.DeepEqual(ct.EndOfTurn(), []string{ImEnd}) {
		t.Errorf("toy model folder: got %q %q, want chatml [<|im_end|>]", ct.Name(), ct.EndOfTurn())
	}

	// A template that always fails when run falls back by its markers.
	dir = t.TempDir()
	writeFile(t, dir, "tokenizer_config.json", `{"chat_template": "{{ '<|im_start|>' }}{{ raise_exception('never') }}"}`)
	ct, err = LoadChatTemplate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if ct.Name() != TemplateChatML {
		t.Errorf("template that always raises: got %q, want chatml", ct.Name())
	}

	// A template gonja cannot parse falls back by its markers.
	dir = t.TempDir()
	writeFile(t, dir, "tokenizer_config.json", `{"eos_token": "<|eot_id|>", "chat_template": "{% for m in messages %}<|start_header_id|>{{ m.role }<|end_header_id|>{% endfor %}"}`)
	ct, err = LoadChatTemplate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if ct.Name() != TemplateLlama3 || !reflect.DeepEqual(ct.EndOfTurn(), []string{llama3EOT}) {
		t.Errorf("broken llama template: got %q %q, want llama3 [<|eot_id|>]", ct.Name(), ct.EndOfTurn())
	}

	// Bad JSON names the file.
	dir = t.TempDir()
	writeFile(t, dir, "tokenizer_config.json", `{"chat_template": 5}`)
	if _, err := LoadChatTemplate(dir); err == nil || !strings.Contains(err.Error(), "tokenizer_config.json") {
		t.Errorf("bad chat_template: err = %v", err)
	}
}

func TestStrftime(t *testing.T) {
	at := time.Date(2024, time.July, 6, 15, 4, 5, 0, time.UTC)
	if got, want := strftime(at, "%d %b %Y|%B %m/%y %H:%M:%S %A %a %p %I %% %q"), "06 Jul 2024|July 07/24 15:04:05 Saturday Sat PM 03 % %q"; got != want {
		t.Errorf("strftime = %q, want %q", got, want)
	}
	j, err := compileJinja(`{{ strftime_now("%Y") }}`, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := j.render(nil, false, nil); err != nil || got != strconv.Itoa(time.Now().Year()) {
		t.Errorf("strftime_now(%%Y) = %q, %v", got, err)
	}
}

func TestToJSONFilterIsPythonLike(t *testing.T) {
	j, err := compileJinja(`{{ {"a": "<b> & 'c'", "n": [1, 2]} | tojson }}`, "", "")
	if err != nil {
		t.Fatal(err)
	}
	got, err := j.render(nil, false, nil)
	if want := `{"a": "<b> & 'c'", "n": [1, 2]}`; err != nil || got != want {
		t.Errorf("tojson: got %q, %v; want %q", got, err, want)
	}
}

// TestConcurrentUse encodes and renders from several goroutines at once (the
// rollout batches do) and checks the results match a serial run; run with
// -race to check for data races.
func TestConcurrentUse(t *testing.T) {
	tok, err := parse(testTokenizerJSON(qwenPreTokenizer, `{"type":"NFC"}`, false, false, false))
	if err != nil {
		t.Fatal(err)
	}
	ct, err := LoadChatTemplate(filepath.Join("testdata", "models", "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	prompts := make([]string, 40)
	for i := range prompts {
		msgs := []Message{{Role: "system", Content: "You are agent " + strings.Repeat("x", i)}, {Role: "user", Content: "Hello world " + strings.Repeat("12 ", i)}}
		if prompts[i], err = ct.Render(msgs, true); err != nil {
			t.Fatal(err)
		}
	}
	want := make([][]int, len(prompts))
	for i, p := range prompts {
		want[i] = tok.Encode(p)
	}
	errs := make(chan string, 4*len(prompts))
	done := make(chan struct{})
	for g := 0; g < 4; g++ {
		go func() {
			defer func() { done <- struct{}{} }()
			for i, p := range prompts {
				msgs := []Message{{Role: "system", Content: "You are agent " + strings.Repeat("x", i)}, {Role: "user", Content: "Hello world " + strings.Repeat("12 ", i)}}
				if r, err := ct.Render(msgs, true); err != nil || r != p {
					errs <- "render differs"
				}
				if got := tok.Encode(p); !reflect.DeepEqual(got, want[i]) {
					errs <- "encode differs"
				}
			}
		}()
	}
	for g := 0; g < 4; g++ {
		<-done
	}
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}

// Tool calls and tool definitions reach a template as transformers hands them over, key order
// included; what a template cannot be given is an error, not a silent omission.
func TestToolConversationRendering(t *testing.T) {
	qwen, err := LoadChatTemplate("testdata/models/qwen3")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(qwen.Source(), "<tool_call>") {
		t.Errorf("Source() does not hold the template")
	}
	call := ToolCall{Type: "function", Function: llm.FunctionCall{Name: "f", Arguments: json.RawMessage(`{"z": 1, "a": {"y": 2.0, "b": "é"}}`)}}
	conv := []Message{{Role: "user", Content: "u"}, {Role: "assistant", ToolCalls: []ToolCall{call}}, {Role: "tool", Content: "r", Name: "f"}}
	tools := json.RawMessage(`[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]`)
	got, err := qwen.RenderWith(conv, true, map[string]any{"tools": tools})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"<tools>\n" + `{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}` + "\n</tools>",
		"<|im_start|>assistant\n<tool_call>\n" + `{"name": "f", "arguments": {"z": 1, "a": {"y": 2.0, "b": "é"}}}` + "\n</tool_call><|im_end|>",
		"<|im_start|>user\n<tool_response>\nr\n</tool_response><|im_end|>",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("render lacks %q:\n%q", want, got)
		}
	}
	// The same tools as a Go map come out in sorted key order (Go maps have none).
	var asMap []any
	if err := json.Unmarshal(tools, &asMap); err != nil {
		t.Fatal(err)
	}
	got, err = qwen.RenderWith(conv[:1], true, map[string]any{"tools": asMap})
	if err != nil || !strings.Contains(got, `{"function": {"name": "f", "parameters": {"properties": {}, "type": "object"}}, "type": "function"}`) {
		t.Errorf("tools as Go maps: %v\n%q", err, got)
	}

	bad := []Message{{Role: "assistant", ToolCalls: []ToolCall{{Type: "function", Function: llm.FunctionCall{Name: "g", Arguments: json.RawMessage(`{"x": }`)}}}}}
	if _, err := qwen.Render(bad, false); err == nil || !strings.Contains(err.Error(), "message 0: tool call 0 (g): arguments: invalid JSON") {
		t.Errorf("invalid arguments: %v", err)
	}
	if _, err := qwen.RenderWith(conv[:1], true, map[string]any{"tools": json.RawMessage(`[{]`)}); err == nil || !strings.Contains(err.Error(), "argument tools: invalid JSON") {
		t.Errorf("invalid tools JSON: %v", err)
	}

	for _, name := range []string{TemplateChatML, TemplateQwen3, TemplateLlama3, TemplatePlain} {
		b, err := BuiltinChatTemplate(name, "")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Render(conv, true); err == nil || !strings.Contains(err.Error(), "cannot render tool calls (message 1)") {
			t.Errorf("%s with tool calls: %v, want a refusal", name, err)
		}
		if _, err := b.RenderWith(conv[:1], true, map[string]any{"tools": tools}); err == nil || !strings.Contains(err.Error(), "cannot render tools") {
			t.Errorf("%s with tools: %v, want a refusal", name, err)
		}
		if _, err := b.RenderWith(conv[2:], true, map[string]any{"tools": nil}); err != nil {
			t.Errorf("%s with a tool message and tools=None: %v", name, err)
		}
	}
}

// The built-ins read template arguments given as raw JSON (a server's chat_template_kwargs) as
// they read Go values.
func TestBuiltinRawKwargs(t *testing.T) {
	b, err := BuiltinChatTemplate(TemplateQwen3, "")
	if err != nil {
		t.Fatal(err)
	}
	conv := []Message{{Role: "user", Content: "u"}}
	for _, c := range []struct {
		kwargs map[string]any
		think  bool
	}{
		{map[string]any{"enable_thinking": true}, true},
		{map[string]any{"enable_thinking": json.RawMessage("true")}, true},
		{map[string]any{"enable_thinking": json.RawMessage("false")}, false},
		{map[string]any{"tools": json.RawMessage("null")}, false},
		{nil, false},
	} {
		got, err := b.RenderWith(conv, true, c.kwargs)
		if err != nil {
			t.Fatalf("%v: %v", c.kwargs, err)
		}
		if hasEmpty := strings.HasSuffix(got, "<think>\n\n</think>\n\n"); hasEmpty == c.think {
			t.Errorf("%v: %q", c.kwargs, got)
		}
	}
	if _, err := b.RenderWith(conv, true, map[string]any{"enable_thinking": json.RawMessage("tru")}); err == nil {
		t.Error("invalid JSON for enable_thinking: no error")
	}
}
