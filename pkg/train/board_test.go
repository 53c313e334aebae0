package train

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/rs/zerolog/log"

	"github.com/drmas/drmas/pkg/report"
	"github.com/drmas/drmas/pkg/rundir"
	"github.com/drmas/drmas/pkg/tbevent"
)

// boardEvents reads every event file of a run's tensorboard folder, in name order (TensorBoard's),
// and returns the step Events (the files' first Events aside).
func boardEvents(t *testing.T, run string) (files int, evs []tbevent.Event) {
	t.Helper()
	paths, err := tbevent.Files(filepath.Join(run, report.TensorBoardDir))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		es, err := tbevent.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(es) == 0 || es[0].FileVersion != tbevent.FileVersion || es[0].Writer != tbevent.WriterName {
			t.Fatalf("%s: no file_version Event first", p)
		}
		evs = append(evs, es[1:]...)
	}
	return len(paths), evs
}

// metricsRows reads metrics.jsonl as written: every key, null for a non-finite value.
func metricsRows(t *testing.T, run string) []map[string]*float64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(run, rundir.MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	var rows []map[string]*float64
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var row map[string]*float64
		if err := json.Unmarshal([]byte(line), &row); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, row)
	}
	return rows
}

// checkBoard holds a run's event files to its metrics.jsonl: one Event per row, at the row's step,
// in order, each step once; every key of the row as a scalar of its value (float32; NaN for null);
// a histogram of each agent's advantages; a transcript text every dumpEvery steps.
func checkBoard(t *testing.T, run string, dumpEvery int, agents []string) int {
	t.Helper()
	files, evs := boardEvents(t, run)
	rows := metricsRows(t, run)
	if len(evs) != len(rows) {
		t.Fatalf("%d events for %d metrics rows", len(evs), len(rows))
	}
	for i, e := range evs {
		row := rows[i]
		if step := int64(*row["step"]); e.Step != step || e.Step != int64(i+1) {
			t.Fatalf("event %d at step %d, metrics row at %d: want steps 1, 2, … once each, in order", i, e.Step, step)
		}
		scalars, histos, texts := map[string]float32{}, map[string]*tbevent.Histogram{}, 0
		for _, v := range e.Summary {
			switch v.Kind {
			case tbevent.KindScalar:
				scalars[v.Tag] = v.Scalar
			case tbevent.KindHistogram:
				histos[v.Tag] = v.Histo
			case tbevent.KindText:
				texts++
				if v.Tag != "transcripts" || !strings.Contains(v.Text, "**trajectory ") || !strings.Contains(v.Text, " · **solver**") {
					t.Errorf("step %d: text %q", e.Step, v.Text)
				}
			}
		}
		for k, p := range row {
			if k == "step" {
				continue
			}
			got, ok := scalars[k]
			switch {
			case !ok:
				t.Errorf("step %d: no scalar %s", e.Step, k)
			case p == nil && !math.IsNaN(float64(got)), p != nil && got != float32(*p):
				t.Errorf("step %d: scalar %s = %v, metrics.jsonl %v", e.Step, k, got, p)
			}
		}
		if len(scalars) != len(row)-1 {
			t.Errorf("step %d: %d scalars for %d keys", e.Step, len(scalars), len(row)-1)
		}
		for _, a := range agents {
			h := histos["adv/agent/"+a]
			if h == nil || h.Num < 1 {
				t.Fatalf("step %d: no advantage histogram for %s", e.Step, a)
			}
			sum := 0.0
			for _, c := range h.Bucket {
				sum += c
			}
			if sum != h.Num || float32(h.Min) != scalars["adv/agent/"+a+"/min"] || float32(h.Max) != scalars["adv/agent/"+a+"/max"] {
				t.Errorf("step %d, %s: histogram %+v against the adv/agent scalars", e.Step, a, h)
			}
		}
		if want := dumpEvery > 0 && int(e.Step)%dumpEvery == 0; (texts == 1) != want {
			t.Errorf("step %d: %d transcript texts (dump every %d)", e.Step, texts, dumpEvery)
		}
	}
	return files
}

// A fresh run writes one event file mirroring metrics.jsonl; a run resumed from an older checkpoint
// writes a second file of the steps after it, and the first file loses its steps after the
// checkpoint: over the files, every step once, in order. run.tensorboard: false writes none.
func TestBoardResume(t *testing.T) {
	dir := t.TempDir()
	agents := []string{"solver", "verifier"}
	train(t, tinyConfig(t, dir, "run.steps=4", "warmup.steps=0", "run.dump_every=2"), Options{})
	if files := checkBoard(t, dir, 2, agents); files != 1 {
		t.Fatalf("%d event files after a fresh run, want 1", files)
	}
	// The newest checkpoint lost: the resume goes back to step 2 while the event file holds 3 and 4.
	if err := os.RemoveAll(rundir.CheckpointDir(dir, 4)); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	saved := log.Logger
	log.Logger = zerolog.New(&logs)
	tr := train(t, tinyConfig(t, dir, "run.steps=5", "warmup.steps=0", "run.dump_every=2"), Options{Resume: true})
	log.Logger = saved
	if tr.step != 5 {
		t.Fatalf("resumed run ended at %d", tr.step)
	}
	checkSummary(t, logs.String(), dir)
	if files := checkBoard(t, dir, 2, agents); files != 2 {
		t.Fatalf("%d event files after a resume, want 2", files)
	}
	mustExist(t, filepath.Join(dir, "curves.svg")) // drawn when training ends

	off := t.TempDir()
	train(t, tinyConfig(t, off, "run.steps=1", "warmup.steps=0", "run.tensorboard=false"), Options{})
	if _, err := os.Stat(filepath.Join(off, report.TensorBoardDir)); !os.IsNotExist(err) {
		t.Fatalf("run.tensorboard: false, yet %v", err)
	}
}

// checkSummary finds the "training done" line of a run resumed from step 2 to 5 and checks what it
// tells: the steps, the reward first → last over the whole run, the time with its unit, where the
// checkpoint, the curves and the event files are.
func checkSummary(t *testing.T, logs, dir string) {
	t.Helper()
	for _, line := range strings.Split(logs, "\n") {
		var f map[string]any
		if json.Unmarshal([]byte(line), &f) != nil || f["message"] != "training done" {
			continue
		}
		want := map[string]string{"steps": "3–5", "run_steps": "1–5", "checkpoint": filepath.Join(dir, "step-5"),
			"curves": filepath.Join(dir, "curves.svg"), "tensorboard": filepath.Join(dir, report.TensorBoardDir)}
		for k, v := range want {
			if f[k] != v {
				t.Errorf("summary %s = %v, want %q", k, f[k], v)
			}
		}
		if r, _ := f["reward"].(string); !strings.Contains(r, " → ") || !strings.HasSuffix(r, "(steps 1 → 5)") {
			t.Errorf("summary reward %q", r)
		}
		if took, _ := f["took"].(string); !strings.HasSuffix(took, "s") {
			t.Errorf("summary took %q: want a duration with its unit", took)
		}
		return
	}
	t.Fatalf("no training done line in:\n%s", logs)
}

// A run killed (SIGKILL) after writing steps past its last checkpoint, resumed: over the event files
// every step once, in order, matching metrics.jsonl (the killed run's later steps pruned, a torn last
// record too). The child is TestHelperTrain.
func TestBoardAfterSIGKILL(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperTrain$")
	cmd.Env = append(os.Environ(), "DRMAS_TEST_TRAIN_DIR="+dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		steps, _ := rundir.Steps(dir)
		_, evs := boardEventsLoose(dir)
		if len(steps) > 0 && steps[len(steps)-1] >= 2 && len(evs) > 0 && int(evs[len(evs)-1].Step)%2 == 1 {
			break // the event file holds a step after the newest checkpoint
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("the child run wrote no step past a checkpoint within 60 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	steps, _ := rundir.Steps(dir)
	last := steps[len(steps)-1]
	tr := train(t, tinyConfig(t, dir, fmt.Sprintf("run.steps=%d", last+2)), Options{Resume: true})
	if tr.step != last+2 {
		t.Fatalf("resumed run ended at %d, want %d", tr.step, last+2)
	}
	checkBoard(t, dir, 0, []string{"solver", "verifier"})
}

// boardEventsLoose reads what it can of a run's event files while a run writes them.
func boardEventsLoose(run string) (int, []tbevent.Event) {
	paths, _ := tbevent.Files(filepath.Join(run, report.TensorBoardDir))
	var evs []tbevent.Event
	for _, p := range paths {
		es, _ := tbevent.ReadFile(p)
		if len(es) > 1 {
			evs = append(evs, es[1:]...)
		}
	}
	return len(paths), evs
}
