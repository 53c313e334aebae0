package dataset

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"

	"github.com/drmas/drmas/pkg/env"
)

// verlSchema mirrors what pandas / pyarrow write for a Search-R1 (verl) training file: optional
// columns, a LIST of chat messages, LIST<string> gold answers and nested structs.
var verlSchema = parquet.NewSchema("schema", parquet.Group{
	"id":             parquet.Optional(parquet.String()),
	"question":       parquet.Optional(parquet.String()),
	"golden_answers": parquet.Optional(parquet.List(parquet.Optional(parquet.String()))),
	"prompt": parquet.Optional(parquet.List(parquet.Optional(parquet.Group{
		"role":    parquet.Optional(parquet.String()),
		"content": parquet.Optional(parquet.String()),
	}))),
	"reward_model": parquet.Optional(parquet.Group{
		"style": parquet.Optional(parquet.String()),
		"ground_truth": parquet.Optional(parquet.Group{
			"target": parquet.Optional(parquet.List(parquet.Optional(parquet.String()))),
		}),
	}),
	"extra_info": parquet.Optional(parquet.Group{
		"index": parquet.Optional(parquet.Int(64)),
		"split": parquet.Optional(parquet.String()),
	}),
})

func verlRow(id, q string, golds ...string) map[string]any {
	gs := make([]any, len(golds))
	for i, g := range golds {
		gs[i] = g
	}
	return map[string]any{
		"id":             id,
		"question":       q,
		"golden_answers": gs,
		"prompt":         []any{map[string]any{"role": "user", "content": "Answer: " + q}},
		"reward_model":   map[string]any{"style": "rule", "ground_truth": map[string]any{"target": gs}},
		"extra_info":     map[string]any{"index": int64(100 + len(q)), "split": "train"},
	}
}

func writeParquet[T any](t *testing.T, name string, rows []T, opts ...parquet.WriterOption) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	w := parquet.NewGenericWriter[T](f, opts...)
	if _, err := w.Write(rows); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadParquetVerlQA(t *testing.T) {
	path := writeParquet(t, "nq_train.parquet", []map[string]any{
		verlRow("train_0", "who wrote hamlet", "Shakespeare", "William Shakespeare"),
		verlRow("train_1", "capital of france", "Paris"),
	}, verlSchema)

	t.Run("auto is qa", func(t *testing.T) {
		checkTasks(t, mustLoad(t, path, Options{}), []env.Task{
			{ID: "train_0", Question: "who wrote hamlet", Answers: []string{"Shakespeare", "William Shakespeare"}},
			{ID: "train_1", Question: "capital of france", Answers: []string{"Paris"}},
		})
	})
	t.Run("nested struct, list and int fields", func(t *testing.T) {
		opt := Options{Fields: Fields{ID: "extra_info.index", Question: "prompt.0.content", Answer: "reward_model.ground_truth"}}
		checkTasks(t, mustLoad(t, path, opt), []env.Task{
			{ID: "116", Question: "Answer: who wrote hamlet", Answers: []string{"Shakespeare", "William Shakespeare"}},
			{ID: "117", Question: "Answer: capital of france", Answers: []string{"Paris"}},
		})
	})
	t.Run("limit", func(t *testing.T) {
		if got := mustLoad(t, path, Options{Limit: 1}); len(got) != 1 || got[0].ID != "train_0" {
			t.Errorf("Limit 1 gave %+v", got)
		}
	})
	t.Run("missing column", func(t *testing.T) {
		_, err := Load(path, Options{Fields: Fields{Question: "query"}})
		want := path + `: row 0: missing field "query"`
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want it to contain %q", err, want)
		}
	})
}

// gsm8kRow and mathRow are written through parquet-go's struct mapping (required columns).
type gsm8kRow struct {
	Question string `parquet:"question"`
	Answer   string `parquet:"answer"`
}

type mathRow struct {
	Problem  string   `parquet:"problem"`
	Solution string   `parquet:"solution"`
	Level    string   `parquet:"level"`
	Tags     []string `parquet:"tags"` // a plain repeated column
}

type plainRow struct {
	Question string   `parquet:"question"`
	Answer   float64  `parquet:"answer"`
	Aliases  []string `parquet:"aliases,list"`
}

func TestLoadParquetShapes(t *testing.T) {
	t.Run("gsm8k", func(t *testing.T) {
		path := writeParquet(t, "gsm8k.parquet", []gsm8kRow{
			{"How many?", "6 * 12 = 72\n#### 72"},
			{"How much?", "#### 1,080"},
		})
		checkTasks(t, mustLoad(t, path, Options{}), []env.Task{
			{ID: "gsm8k-0", Question: "How many?", Answers: []string{"72"}},
			{ID: "gsm8k-1", Question: "How much?", Answers: []string{"1080"}},
		})
	})
	t.Run("math", func(t *testing.T) {
		path := writeParquet(t, "math.parquet", []mathRow{
			{"Half of 1?", `It is $\boxed{\frac{1}{2}}$.`, "Level 1", []string{"a", "b"}},
		})
		checkTasks(t, mustLoad(t, path, Options{}), []env.Task{
			{ID: "math-0", Question: "Half of 1?", Answers: []string{`\frac{1}{2}`}},
		})
		// The repeated column reads as a list.
		checkTasks(t, mustLoad(t, path, Options{Shape: ShapePlain, Fields: Fields{Question: "problem", Answer: "tags"}}), []env.Task{
			{ID: "math-0", Question: "Half of 1?", Answers: []string{"a", "b"}},
		})
	})
	t.Run("plain double and LIST", func(t *testing.T) {
		path := writeParquet(t, "plain.parquet", []plainRow{{"x?", 72, []string{"seventy-two"}}, {"y?", 0.5, nil}})
		checkTasks(t, mustLoad(t, path, Options{}), []env.Task{
			{ID: "plain-0", Question: "x?", Answers: []string{"72"}},
			{ID: "plain-1", Question: "y?", Answers: []string{"0.5"}},
		})
		checkTasks(t, mustLoad(t, path, Options{Fields: Fields{Answer: "aliases"}, Limit: 1}), []env.Task{
			{ID: "plain-0", Question: "x?", Answers: []string{"seventy-two"}},
		})
		_, err := Load(path, Options{Fields: Fields{Answer: "aliases"}})
		if want := path + `: row 1: field "aliases" is an empty list`; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want it to contain %q", err, want)
		}
	})
}

func TestLoadParquetErrors(t *testing.T) {
	t.Run("empty", func(t *testing.T) {
		path := writeParquet(t, "empty.parquet", []gsm8kRow{})
		_, err := Load(path, Options{})
		if err == nil || !strings.Contains(err.Error(), path+" is empty") {
			t.Errorf("error %v, want an empty-dataset error naming %s", err, path)
		}
	})
	t.Run("not parquet", func(t *testing.T) {
		path := writeFile(t, "junk.parquet", `{"question": "a", "answer": "1"}`)
		_, err := Load(path, Options{})
		if err == nil || !strings.Contains(err.Error(), path+": not a readable Parquet file") {
			t.Errorf("error %v, want a Parquet error naming %s", err, path)
		}
	})
	t.Run("gsm8k row without marker", func(t *testing.T) {
		path := writeParquet(t, "g.parquet", []gsm8kRow{{"a", "#### 1"}, {"b", "2"}})
		_, err := Load(path, Options{Shape: ShapeGSM8K})
		if want := path + `: row 1: field "answer": gsm8k answer has no "####"`; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want it to contain %q", err, want)
		}
	})
}
