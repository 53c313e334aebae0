package dataset

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/env"
)

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func mustLoad(t *testing.T, path string, opt Options) []env.Task {
	t.Helper()
	tasks, err := Load(path, opt)
	if err != nil {
		t.Fatalf("Load(%s): %v", path, err)
	}
	return tasks
}

// checkTasks compares tasks apart from their records (TestRecordShape checks those).
func checkTasks(t *testing.T, got, want []env.Task) {
	t.Helper()
	got = slices.Clone(got)
	for i := range got {
		got[i].Record = nil
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("tasks:\n got  %+v\n want %+v", got, want)
	}
}

func TestLoadJSONLShapes(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		content string
		opt     Options
		want    []env.Task
	}{
		{
			name: "gsm8k auto",
			file: "gsm8k.jsonl",
			content: `{"question": "How many clips?", "answer": "48/2 = 24\n#### 72"}` + "\n" +
				`{"question": "How much money?", "answer": "It is 1,200.\n#### 1,200"}` + "\n",
			want: []env.Task{
				{ID: "gsm8k-0", Question: "How many clips?", Answers: []string{"72"}},
				{ID: "gsm8k-1", Question: "How much money?", Answers: []string{"1200"}},
			},
		},
		{
			name: "math auto",
			file: "math.jsonl",
			content: `{"problem": "What is 1/2 + 1/4?", "solution": "We get $\\boxed{\\frac{3}{4}}$."}` + "\n" +
				`{"problem": "Solve x+1=3.", "solution": "First \\boxed{1}, no: \\boxed{ 2 }"}`,
			want: []env.Task{
				{ID: "math-0", Question: "What is 1/2 + 1/4?", Answers: []string{`\frac{3}{4}`}},
				{ID: "math-1", Question: "Solve x+1=3.", Answers: []string{"2"}},
			},
		},
		{
			name: "qa auto with ids",
			file: "nq.jsonl",
			content: `{"id": "train_7", "question": "who wrote hamlet", "golden_answers": ["Shakespeare", "William Shakespeare"]}` + "\n" +
				"\n" + // blank lines are skipped
				`{"id": 12, "question": "capital of france", "golden_answers": "Paris"}` + "\n",
			want: []env.Task{
				{ID: "train_7", Question: "who wrote hamlet", Answers: []string{"Shakespeare", "William Shakespeare"}},
				{ID: "12", Question: "capital of france", Answers: []string{"Paris"}},
			},
		},
		{
			name: "plain numbers and lists",
			file: "toy.json",
			content: `{"question": "key 3?", "answer": 7}` + "\n" +
				`{"question": "key 4?", "answer": ["a", 2.5]}` + "\n",
			want: []env.Task{
				{ID: "toy-0", Question: "key 3?", Answers: []string{"7"}},
				{ID: "toy-1", Question: "key 4?", Answers: []string{"a", "2.5"}},
			},
		},
		{
			name:    "verl nested paths",
			file:    "verl.jsonl",
			content: `{"prompt": [{"role": "user", "content": "Q: 2+2?"}], "reward_model": {"style": "rule", "ground_truth": "4"}, "extra_info": {"index": 5, "question": "2+2?"}}` + "\n",
			opt:     Options{Fields: Fields{ID: "extra_info.index", Question: "prompt.0.content", Answer: "reward_model.ground_truth"}},
			want:    []env.Task{{ID: "5", Question: "Q: 2+2?", Answers: []string{"4"}}},
		},
		{
			name:    "search-r1 ground truth target",
			file:    "sr1.jsonl",
			content: `{"question": "q", "reward_model": {"ground_truth": {"target": ["x", "y"]}}}`,
			opt:     Options{Fields: Fields{Answer: "reward_model.ground_truth"}},
			want:    []env.Task{{ID: "sr1-0", Question: "q", Answers: []string{"x", "y"}}},
		},
		{
			name:    "explicit answer field with #### is gsm8k",
			file:    "g.jsonl",
			content: `{"q": "x", "sol": "work\n#### 5"}`,
			opt:     Options{Fields: Fields{Question: "q", Answer: "sol"}},
			want:    []env.Task{{ID: "g-0", Question: "x", Answers: []string{"5"}}},
		},
		{
			name:    "explicit plain shape keeps the raw answer",
			file:    "p.jsonl",
			content: `{"question": "x", "answer": "work\n#### 5"}`,
			opt:     Options{Shape: ShapePlain},
			want:    []env.Task{{ID: "p-0", Question: "x", Answers: []string{"work\n#### 5"}}},
		},
		{
			name:    "dotted key taken literally",
			file:    "d.jsonl",
			content: `{"question": "x", "a.b": "lit", "a": {"b": "nested"}}`,
			opt:     Options{Fields: Fields{Answer: "a.b"}},
			want:    []env.Task{{ID: "d-0", Question: "x", Answers: []string{"lit"}}},
		},
		{
			name:    "limit",
			file:    "lim.jsonl",
			content: "{\"question\":\"a\",\"answer\":\"1\"}\n{\"question\":\"b\",\"answer\":\"2\"}\n{\"bad\n",
			opt:     Options{Limit: 1},
			want:    []env.Task{{ID: "lim-0", Question: "a", Answers: []string{"1"}}},
		},
		{
			name:    "format forced on an unknown extension",
			file:    "data.txt",
			content: "\xef\xbb\xbf{\"question\":\"a\",\"answer\":\"1\"}",
			opt:     Options{Format: FormatJSONL},
			want:    []env.Task{{ID: "data-0", Question: "a", Answers: []string{"1"}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkTasks(t, mustLoad(t, writeFile(t, tt.file, tt.content), tt.opt), tt.want)
		})
	}
}

func TestLoadJSONLErrors(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		content string
		opt     Options
		want    string // the error must contain "<path><want>"
	}{
		{"malformed line", "train.jsonl", "{\"question\":\"a\",\"answer\":\"1\"}\n\n{\"question\": \n", Options{}, ":3: malformed JSON"},
		{"not an object", "train.jsonl", "{\"question\":\"a\",\"answer\":\"1\"}\n42\n", Options{}, ":2: malformed JSON: a number, want an object"},
		{"two values", "train.jsonl", "{\"question\":\"a\",\"answer\":\"1\"} {}\n", Options{}, ":1: malformed JSON: more than one value"},
		{"json array", "train.json", "[\n{\"question\":\"a\"}\n]\n", Options{}, ":1: a JSON array; want JSON lines"},
		{"missing question", "train.jsonl", "{\"question\":\"a\",\"answer\":\"1\"}\n{\"answer\":\"2\"}\n", Options{}, `:2: missing field "question"`},
		{"null question", "train.jsonl", "{\"question\":null,\"answer\":\"1\"}\n", Options{}, `:1: missing field "question"`},
		{"missing answer", "train.jsonl", "{\"question\":\"a\",\"answer\":\"1\"}\n{\"question\":\"b\"}\n", Options{}, `:2: missing field "answer"`},
		{"missing nested", "train.jsonl", "{\"question\":\"a\",\"reward_model\":{}}\n", Options{Fields: Fields{Answer: "reward_model.ground_truth"}}, `:1: missing field "reward_model.ground_truth"`},
		{"blank question", "train.jsonl", "{\"question\":\"  \",\"answer\":\"1\"}\n", Options{}, `:1: field "question" is empty`},
		{"gsm8k without marker", "train.jsonl", "{\"question\":\"a\",\"answer\":\"no marker\"}\n", Options{Shape: ShapeGSM8K}, `:1: field "answer": gsm8k answer has no "####"`},
		{"math without box", "train.jsonl", "{\"problem\":\"a\",\"solution\":\"just 5\"}\n", Options{Shape: ShapeMath}, `:1: field "solution" has no non-empty \boxed{} answer`},
		{"empty golden answers", "train.jsonl", "{\"question\":\"a\",\"golden_answers\":[]}\n", Options{}, `:1: field "golden_answers" is an empty list`},
		{"struct answer", "train.jsonl", "{\"question\":\"a\",\"answer\":{\"x\":1}}\n", Options{}, `:1: field "answer" is a struct with fields (x)`},
		{"list question", "train.jsonl", "{\"question\":[\"a\"],\"answer\":\"1\"}\n", Options{}, `:1: field "question" is a list`},
		{"duplicate id", "train.jsonl", "{\"id\":1,\"question\":\"a\",\"answer\":\"1\"}\n{\"id\":1,\"question\":\"b\",\"answer\":\"2\"}\n", Options{}, `:2: duplicate id "1" (first at `},
		{"empty file", "train.jsonl", "", Options{}, " is empty"},
		{"only blank lines", "train.jsonl", "\n  \n\n", Options{}, " is empty"},
		{"unknown extension", "train.csv", "a,b\n", Options{}, ": cannot tell the format"},
		{"unknown format", "train.jsonl", "{}\n", Options{Format: "csv"}, `: unknown format "csv"`},
		{"unknown shape", "train.jsonl", "{}\n", Options{Shape: "squad"}, `: unknown shape "squad"`},
		{"negative limit", "train.jsonl", "{}\n", Options{Limit: -1}, ": limit -1 is negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, tt.file, tt.content)
			_, err := Load(path, tt.opt)
			if err == nil {
				t.Fatalf("Load succeeded, want error containing %q", tt.want)
			}
			if !strings.Contains(err.Error(), path+tt.want) {
				t.Errorf("error %q does not contain %q", err, path+tt.want)
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope.jsonl")
	_, err := Load(path, Options{})
	if err == nil || !strings.Contains(err.Error(), path) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("want a not-exist error naming %s, got %v", path, err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "nope.parquet"), Options{}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("want a not-exist error for a missing Parquet file, got %v", err)
	}
}

// Options.Check sees every task: an error names the record's line, keep = false skips it (not
// counted towards Limit), and a file whose records are all skipped is an error saying so.
func TestLoadCheck(t *testing.T) {
	path := filepath.Join(t.TempDir(), "d.jsonl")
	if err := os.WriteFile(path, []byte(`{"question": "a", "answer": "1"}
{"question": "bb", "answer": "2"}

{"question": "c", "answer": "3"}
{"question": "dd", "answer": "4"}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	short := func(t env.Task) (bool, error) { return len(t.Question) == 1, nil }
	tasks, err := Load(path, Options{Check: short, SkipReason: "long", Limit: 2})
	if err != nil || len(tasks) != 2 || tasks[0].Question != "a" || tasks[1].Question != "c" {
		t.Errorf("skip: %v, %v; want a and c", tasks, err)
	}
	refuse := func(t env.Task) (bool, error) {
		if len(t.Question) > 1 {
			return false, errors.New("too long")
		}
		return true, nil
	}
	if _, err := Load(path, Options{Check: refuse}); err == nil || err.Error() != path+":2: too long" {
		t.Errorf("refuse: err %v", err)
	}
	none := func(env.Task) (bool, error) { return false, nil }
	if _, err := Load(path, Options{Check: none, SkipReason: "long"}); err == nil || !strings.Contains(err.Error(), "all 4 records read were skipped (long)") {
		t.Errorf("all skipped: err %v", err)
	}
}

// The record shape takes any JSON object (a gateway runner reads it): no field is required, each
// task carries its record as it stands (numbers spelled as written), and its ID from the ID field
// when there is one. Every shape keeps the record too.
func TestRecordShape(t *testing.T) {
	path := writeFile(t, "any.jsonl", `{"id": "a1", "prompt": [{"role": "user", "content": "hi"}], "n": 12345678901234567890}
{"scenario": "checkout", "budget": 2.50}
`)
	tasks := mustLoad(t, path, Options{Shape: ShapeRecord})
	if len(tasks) != 2 || tasks[0].ID != "a1" || tasks[1].ID != "any-1" {
		t.Fatalf("tasks %+v", tasks)
	}
	if got := string(tasks[0].Record); got != `{"id":"a1","n":12345678901234567890,"prompt":[{"content":"hi","role":"user"}]}` {
		t.Errorf("record %s", got)
	}
	if got := string(tasks[1].Record); got != `{"budget":2.50,"scenario":"checkout"}` {
		t.Errorf("record %s", got)
	}
	if _, err := Load(path, Options{}); err == nil {
		t.Error("auto shape: records without a question loaded")
	}
}
