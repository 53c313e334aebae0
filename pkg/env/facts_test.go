package env

import (
	"context"
	"slices"
	"testing"
)

func docIDs(docs []Doc) []string {
	out := make([]string, len(docs))
	for i, d := range docs {
		out[i] = d.ID
	}
	return out
}

func TestFactRetriever(t *testing.T) {
	r := FactRetriever{Corpus: []string{"capital of france=Paris", "capital=a city", "france=a country"}}
	task := Task{Facts: []string{"k=7", "m=3", "K m=9"}}
	got, err := r.RetrieveTasks(context.Background(), []Task{task, task, task, {}},
		[]string{"K", "  m ", "capital of France", "k"}, 2)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		i    int
		want []string
	}{
		{0, []string{"k", "K m"}},                     // exact key first, then half the words of "K m"
		{1, []string{"m", "K m"}},                     // whitespace and case ignored
		{2, []string{"capital of france", "capital"}}, // topk cuts "france"
		{3, []string{}},                               // the task's facts are its own
	}
	for _, c := range cases {
		if ids := docIDs(got[c.i]); !slices.Equal(ids, c.want) {
			t.Errorf("query %d: %v, want %v", c.i, ids, c.want)
		}
	}
	if got[0][0].Contents != "k=7" || got[0][0].Score != 2 || got[0][1].Score != 0.5 {
		t.Errorf("docs %+v", got[0])
	}
	plain, err := r.Retrieve(context.Background(), []string{"k", "France"}, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(plain[0]) != 0 || len(plain[1]) != 2 || plain[1][0].ID != "france" {
		t.Errorf("Retrieve searches the corpus alone: %+v", plain)
	}
	if _, err := r.RetrieveTasks(context.Background(), []Task{task}, []string{"a", "b"}, 1); err == nil {
		t.Error("misaligned tasks and queries were accepted")
	}
}

func TestTagParsers(t *testing.T) {
	cases := []struct {
		p     Parser
		in    string
		want  string
		valid bool
	}{
		{TagParser("search"), "<think>x</think><search> who </search>", "who", true},
		{TagParser("search"), "<search>a</search> then <search>b</search>", "b", true},
		{TagParser("search"), "<search></search>", "", false},
		{TagParser("search"), "<search>open", "", false},
		{TagParser("search"), "</search>x<search>", "", false},
		{TagParser("verify", "yes", "no"), "<verify>Yes</verify>", "yes", true},
		{TagParser("verify", "yes", "no"), "<verify>maybe</verify>", "maybe", false},
		{BoxedParser, `so \boxed{\frac{1}{2}}`, `\frac{1}{2}`, true},
		{BoxedParser, `\boxed{3} then \boxed{4}`, "4", true},
		{BoxedParser, `\boxed{ }`, "", false},
		{BoxedParser, `no box`, "", false},
	}
	for _, c := range cases {
		got, ok := c.p(c.in)
		if got != c.want || ok != c.valid {
			t.Errorf("%q: got %q %v, want %q %v", c.in, got, ok, c.want, c.valid)
		}
	}
}
