package train

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// groupScores reads an iteration's transcripts (rollouts/step-N.jsonl): each prompt group's call
// scores, by uid.
func groupScores(t *testing.T, dir string, step int) map[string][]float64 {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "rollouts", fmt.Sprintf("step-%d.jsonl", step)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]float64{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var line struct {
			UID   string  `json:"uid"`
			Score float64 `json:"score"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatal(err)
		}
		out[line.UID] = append(out[line.UID], line.Score)
	}
	return out
}

func constant(xs []float64) bool {
	for _, x := range xs {
		if x != xs[0] {
			return false
		}
	}
	return true
}

// algorithm.filter_groups (DAPO's dynamic sampling): the toy team trains on groups whose calls do not
// all score alike, as many as the batch holds or as max_draws batches gave (the first batch as it is
// when no draw had a group with signal), while without it the same iterations train on such groups too; the filter's counts agree with the transcripts, and a resumed
// run draws the same extra batches (the same metrics as the uninterrupted run).
func TestFilterGroups(t *testing.T) {
	const steps = 3
	sets := []string{fmt.Sprintf("run.steps=%d", steps), "run.save_every=1", "run.dump_every=1", "warmup.steps=30", "agents.0.sampling.max_new_tokens=6"}
	off := t.TempDir()
	train(t, tinyConfig(t, off, sets...), Options{})
	flat := 0
	for s := 1; s <= steps; s++ {
		for _, sc := range groupScores(t, off, s) {
			if constant(sc) {
				flat++
			}
		}
	}
	if flat == 0 {
		t.Fatal("without the filter no group scored alike: the test shows nothing")
	}
	on, parts := t.TempDir(), t.TempDir()
	filter := append(sets, "algorithm.filter_groups={enable: true, max_draws: 3}")
	train(t, tinyConfig(t, on, filter...), Options{})
	rows := readRows(t, on)
	filtered := 0
	for s := 1; s <= steps; s++ {
		groups := groupScores(t, on, s)
		m := rows[s-1]
		draws, kept, dropped := m["rollout/filter/draws"].(float64), m["rollout/filter/groups"].(float64), m["rollout/filter/dropped_groups"].(float64)
		if int(kept) != len(groups) || kept > 4 || (kept < 4 && draws != 3) || draws < 1 || draws > 3 {
			t.Errorf("step %d: %v groups kept of %v draws (%v dropped), %d in the transcripts; want 4 groups, or 3 draws", s, kept, draws, dropped, len(groups))
		}
		if dropped == draws*4 { // no group of any draw had signal: the first batch trains as it is
			continue
		}
		filtered += int(dropped)
		for uid, sc := range groups {
			if constant(sc) {
				t.Errorf("step %d: group %s trained with every call scoring %v", s, uid, sc[0])
			}
		}
	}
	if filtered == 0 {
		t.Fatal("the filter dropped no group while some had signal: the test shows nothing")
	}
	train(t, tinyConfig(t, parts, append(filter, "run.steps=1")...), Options{})
	train(t, tinyConfig(t, parts, filter...), Options{Resume: true})
	sameRows(t, rows, readRows(t, parts))
}
