package serve

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// A bad adapter name is refused by both load endpoints with 400, naming the name and the form
// wanted (before: a name with white space at an end or a tab was loaded under a name clients could
// not send back, and the refusals said neither; names that are not one path segment, ../../etc/passwd
// or a/b, were loaded until #52).
func TestLoRANameErrors(t *testing.T) {
	_, url, root, _ := loraServer(t, Options{})
	dir := filepath.Join(root, "a")
	long := strings.Repeat("x", 300)
	for _, tc := range []struct{ name, says string }{
		{" a", `" a"`},
		{"a ", `"a "`},
		{"a\tb", `"a\tb"`},
		{"a\x01b", `"a\x01b"`},
		{"a\nb", `"a\nb"`},
		{long, "300 bytes"},
		{toyDir, fmt.Sprintf("%q is the base model's name", toyDir)},
		{"../../etc/passwd", `"../../etc/passwd"`},
		{"a/b", `"a/b"`},
		{`a\b`, `"a\\b"`},
		{"..", `".."`},
		{".", `"."`},
	} {
		for _, ep := range []string{"/v1/load_lora_adapter", "/load_lora_adapter"} {
			code, r := call(t, url+ep, "", map[string]any{"lora_name": tc.name, "lora_path": dir})
			msg := fmt.Sprint(r)
			if code != 400 || !strings.Contains(msg, tc.says) || !strings.Contains(msg, "printable characters") {
				t.Errorf("%s with lora_name %q: HTTP %d %v; want 400 naming %s and the form wanted", ep, tc.name, code, r, tc.says)
			}
		}
	}
	if code, body := raw(t, url+"/v1/load_lora_adapter", fmt.Sprintf(`{"lora_name": "verifier@100 (step 100)", "lora_path": %q}`, dir)); code != 200 {
		t.Errorf("a name with inner spaces and punctuation: HTTP %d %s", code, body)
	}
}

// An API key no client can send (only white space, white space at an end, a control character)
// is refused when the server starts (before: all-white-space keys started a server that answered
// 401 to every client).
func TestUnusableAPIKeyRefused(t *testing.T) {
	p := loadToy(t)
	for _, key := range []string{" ", "   \t", "\n", "key\n", " key", "key ", "k\x01ey"} {
		if _, err := New(p, toyDir, Options{APIKey: key}); err == nil || !strings.Contains(err.Error(), "--api-key") {
			t.Errorf("API key %q: %v, want a refusal naming --api-key", key, err)
		}
	}
	if _, err := New(p, toyDir, Options{APIKey: "a key with spaces inside"}); err != nil {
		t.Errorf("a key with inner spaces: %v", err)
	}
}

// A reply on an adapter names the adapter as its "model", whole or streamed (before: the base's
// name, so a client could not tell which weights answered); a reply on the base names the base.
func TestLoRAReplyNamesAdapter(t *testing.T) {
	_, url, root, _ := loraServer(t, Options{})
	if code, body := raw(t, url+"/v1/load_lora_adapter", fmt.Sprintf(`{"lora_name": "solver", "lora_path": %q}`, filepath.Join(root, "a"))); code != 200 {
		t.Fatalf("load: HTTP %d %s", code, body)
	}
	for _, model := range []string{"solver", toyDir, ""} {
		want := model
		if want == "" {
			want = toyDir
		}
		for _, ep := range []struct {
			path string
			body map[string]any
		}{
			{"/v1/completions", map[string]any{"model": model, "prompt": "ab", "max_tokens": 2}},
			{"/v1/chat/completions", map[string]any{"model": model, "messages": []map[string]string{{"role": "user", "content": "hi"}}, "max_tokens": 2}},
		} {
			code, r := call(t, url+ep.path, "", ep.body)
			if code != 200 || r["model"] != want {
				t.Errorf("%s on %q: HTTP %d, model %v; want %q", ep.path, model, code, r["model"], want)
			}
			ep.body["stream"] = true
			ep.body["stream_options"] = map[string]any{"include_usage": true}
			b, _ := json.Marshal(ep.body)
			code, text := raw(t, url+ep.path, string(b))
			chunks := 0
			for _, line := range strings.Split(text, "\n") {
				data, ok := strings.CutPrefix(line, "data: ")
				if !ok || data == "[DONE]" {
					continue
				}
				var c map[string]any
				if err := json.Unmarshal([]byte(data), &c); err != nil || c["model"] != want {
					t.Errorf("%s on %q, streamed: chunk %s; want model %q", ep.path, model, data, want)
				}
				chunks++
			}
			if code != 200 || chunks == 0 {
				t.Errorf("%s on %q, streamed: HTTP %d, %d chunks", ep.path, model, code, chunks)
			}
		}
	}
}
