package train

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/check"
	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/env"
)

// writeLines writes a JSON lines dataset of (question, answer) records.
func writeLines(t *testing.T, path string, questions ...string) {
	t.Helper()
	var b strings.Builder
	for i, q := range questions {
		fmt.Fprintf(&b, "{\"id\": \"t%d\", \"question\": %q, \"answer\": \"%d\"}\n", i+1, q, i)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A record whose first prompt does not fit the model is found when the dataset is loaded, naming the
// file and line (before: a 5,000-character question passed the load and `--dry-run`, and the run
// died when it was drawn); data.filter_overlong_prompts skips it instead; data.max_prompt_length
// lowers the bound; `--dry-run` (Check) finds it among the records it reads.
func TestOverlongPromptsFoundAtLoad(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "train.jsonl")
	writeLines(t, data, "1 + 1", strings.Repeat("9", 5000), "2 + 2")
	sets := []string{"toy.task=''", "warmup.steps=0", "data.train=" + data}

	_, _, err := loadData(tinyConfig(t, dir, sets...))
	if err == nil || !strings.Contains(err.Error(), data+":2: agent solver's first prompt is") ||
		!strings.Contains(err.Error(), "max_position_embeddings 2048 less the agent's max_new_tokens 4") {
		t.Errorf("load: err %v, want one naming %s:2 and the bound", err, data)
	}
	if _, err := check.Check(tinyConfig(t, dir, sets...)); err == nil || !strings.Contains(err.Error(), data+":2") {
		t.Errorf("dry run: err %v, want one naming %s:2", err, data)
	}

	train, _, err := loadData(tinyConfig(t, dir, append(sets, "data.filter_overlong_prompts=true")...))
	if err != nil {
		t.Fatal(err)
	}
	if len(train) != 2 || train[0].ID != "t1" || train[1].ID != "t3" {
		t.Errorf("filtered: %v, want t1 and t3", train)
	}

	_, _, err = loadData(tinyConfig(t, dir, append(sets, "data.max_prompt_length=3")...))
	if err == nil || !strings.Contains(err.Error(), data+":1: agent solver's first prompt is") || !strings.Contains(err.Error(), "data.max_prompt_length 3") {
		t.Errorf("max_prompt_length 3: err %v", err)
	}
	_, _, err = loadData(tinyConfig(t, dir, append(sets, "data.max_prompt_length=3", "data.filter_overlong_prompts=true")...))
	if err == nil || !strings.Contains(err.Error(), "all 3 records read were skipped") {
		t.Errorf("everything filtered: err %v", err)
	}
}

// A later agent's prompt that outgrows the model's context (the verifier reads the question and the
// solver's answer) no longer ends the run (issue #42: with 2,030-character questions the run exited at
// iteration 2, and --resume died there again): a prompt that leaves some room has its max_new_tokens
// cut to it, one that leaves none makes an invalid call with nothing generated, counted in
// rollout/overlong_calls; the run and its resume finish. The first prompts fit: the load-time check
// (TestOverlongPromptsFoundAtLoad) passes the records.
func TestLaterPromptOutgrowsContext(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "train.jsonl")
	writeLines(t, data, strings.Repeat("9", 2030), strings.Repeat("8", 2030))
	// The solver's prompt is 2,031 tokens (+4 new ones); the verifier's 2,037–2,041.
	for _, c := range []struct {
		maxPos   string
		overlong bool
	}{{"2036", true}, {"2043", false}} {
		run := filepath.Join(dir, "ctx-"+c.maxPos)
		sets := []string{"toy.task=''", "warmup.steps=0", "data.train=" + data, "algorithm.batch_size=2", "algorithm.group_size=2",
			"models.0.init.max_position_embeddings=" + c.maxPos, "run.steps=2", "run.save_every=1"}
		train(t, tinyConfig(t, run, sets...), Options{})
		rows := readRows(t, run)
		if len(rows) != 2 {
			t.Fatalf("max_position_embeddings %s: %d metrics rows, want 2", c.maxPos, len(rows))
		}
		n, ok := rows[0]["rollout/overlong_calls"].(float64)
		if c.overlong != (ok && n > 0) {
			t.Errorf("max_position_embeddings %s: rollout/overlong_calls %v, want overlong %v", c.maxPos, rows[0]["rollout/overlong_calls"], c.overlong)
		}
		if c.overlong && rows[0]["invalid/agent/verifier"] != 1.0 {
			t.Errorf("max_position_embeddings %s: invalid/agent/verifier %v, want 1", c.maxPos, rows[0]["invalid/agent/verifier"])
		}
		tr := train(t, tinyConfig(t, run, append(sets, "run.steps=3")...), Options{Resume: true})
		if tr.step != 3 {
			t.Errorf("max_position_embeddings %s: the resumed run ended at %d, want 3", c.maxPos, tr.step)
		}
	}
}

// data.max_prompt_length bounds every turn's prompt, as the memory plan takes it (#52: a later turn
// past it used to run, longer than the plan assumed): with the solver's 2,031-token prompts within
// it and the verifier's 2,037–2,041 over it, the verifier's calls are overlong calls (invalid,
// nothing generated) in a context that holds them all; without it none is.
func TestMaxPromptLengthBoundsLaterTurns(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "train.jsonl")
	writeLines(t, data, strings.Repeat("9", 2030), strings.Repeat("8", 2030))
	for _, c := range []struct {
		maxPrompt string
		overlong  bool
	}{{"2034", true}, {"0", false}} {
		run := filepath.Join(dir, "max-"+c.maxPrompt)
		train(t, tinyConfig(t, run, "toy.task=''", "warmup.steps=0", "data.train="+data, "algorithm.batch_size=2", "algorithm.group_size=2",
			"models.0.init.max_position_embeddings=4096", "data.max_prompt_length="+c.maxPrompt, "run.steps=1"), Options{})
		r := readRows(t, run)[0]
		n, _ := r["rollout/overlong_calls"].(float64)
		if c.overlong != (n > 0) || (c.overlong && r["invalid/agent/verifier"] != 1.0) {
			t.Errorf("data.max_prompt_length %s: overlong calls %v, invalid verifier calls %v; want overlong %v (the verifier's)",
				c.maxPrompt, r["rollout/overlong_calls"], r["invalid/agent/verifier"], c.overlong)
		}
	}
}

// loadData opens a config's world as LoadTeam does and returns its data.
func loadData(cfg *config.Config) ([]env.Task, []env.EvalSet, error) {
	w, err := openTeam(cfg)
	if err != nil {
		return nil, nil, err
	}
	defer w.Close()
	return w.Train, w.Val, nil
}
