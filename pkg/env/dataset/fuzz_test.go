package dataset

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/drmas/drmas/pkg/jsonl"
)

// FuzzJSONLLine feeds arbitrary lines to the JSON lines reader under every shape: it never panics,
// and a task it accepts has a question and at least one gold answer.
func FuzzJSONLLine(f *testing.F) {
	for _, s := range []string{`{"question": "q", "answer": "#### 4"}`, `{"problem": "p", "solution": "\\boxed{3}"}`,
		`{"question": "q", "golden_answers": ["a", "b"]}`, `{"question": "q", "answer": 1e999}`, `{"question": null}`,
		`[1, 2]`, `{"question": "q", "answer": {"x": 1}}`, "{\"question\": \"q\", \"answer\": \"\xff\"}", ``, `{`} {
		f.Add(s)
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, line string) {
		p := filepath.Join(dir, "d.jsonl")
		if err := os.WriteFile(p, []byte(line+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, shape := range []Shape{ShapeAuto, ShapeGSM8K, ShapeMath, ShapeQA, ShapePlain} {
			tasks, err := Load(p, Options{Shape: shape})
			if err != nil {
				continue
			}
			for _, tk := range tasks {
				if tk.Question == "" || len(tk.Answers) == 0 {
					t.Fatalf("shape %s accepted %q as %+v", shape, line, tk)
				}
			}
		}
	})
}

// A line past the bound is an error naming the file and line, not an unbounded read; a dataset
// path that is not a regular file is refused before reading.
func TestLongLineAndNonRegular(t *testing.T) {
	defer func(n int) { jsonl.MaxLine = n }(jsonl.MaxLine)
	jsonl.MaxLine = 64
	p := filepath.Join(t.TempDir(), "d.jsonl")
	body := `{"question": "q", "answer": "1"}` + "\n" + `{"question": "` + strings.Repeat("x", 100) + `", "answer": "1"}` + "\n"
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p, Options{}); err == nil || !strings.Contains(err.Error(), p+":2: line too long") {
		t.Errorf("long line: err %v", err)
	}
	fifo := filepath.Join(t.TempDir(), "fifo.jsonl")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(fifo, Options{}); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("FIFO: err %v", err)
	}
}
