package dataset

import (
	"os"
	"path/filepath"
	"testing"
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
