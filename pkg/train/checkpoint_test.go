package train

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/rs/zerolog/log"
	"github.com/sugarme/gotch"

	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/rundir"
	"github.com/drmas/drmas/pkg/torch"
)

// copyRun copies a run folder (a trained run serves several damage cases).
func copyRun(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(to, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// warmedUp leaves a run as a SIGKILL during iteration 2 does, right after the warm-up checkpoint:
// warm-up, step-0, the KL reference, metrics rows 1–2 and no step-2.
func warmedUp(t *testing.T, dir string) {
	t.Helper()
	train(t, tinyConfig(t, dir, "run.steps=2"), Options{})
	if err := os.RemoveAll(rundir.CheckpointDir(dir, 2)); err != nil {
		t.Fatal(err)
	}
}

// trainedRun is a run of 4 iterations with checkpoints step-2 and step-4 (no warm-up).
func trainedRun(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	train(t, tinyConfig(t, dir, "warmup.steps=0"), Options{})
	return dir
}

// removeManifests turns a run's checkpoints into ones written before manifests.
func removeManifests(t *testing.T, dir string) {
	t.Helper()
	matches, _ := filepath.Glob(filepath.Join(dir, "*", rundir.ManifestFile))
	if len(matches) == 0 {
		t.Fatal("no manifest to remove")
	}
	for _, m := range matches {
		if err := os.Remove(m); err != nil {
			t.Fatal(err)
		}
	}
}

// captureLog sends the global logger to a buffer until the test ends.
func captureLog(t *testing.T) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	old := log.Logger
	log.Logger = zerolog.New(io.MultiWriter(&buf, zerolog.ConsoleWriter{Out: os.Stderr})).Level(zerolog.WarnLevel)
	t.Cleanup(func() { log.Logger = old })
	return &buf
}

func readBytes(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// resumeFallsBackTo2 resumes a damaged copy of a 4-iteration run and checks that it takes step-2,
// keeps the damaged step-4 (as step-4.damaged once the resumed run replaces it), keeps metrics rows
// 1–2 and moves rows 3–4 aside, and that the warning names want.
func resumeFallsBackTo2(t *testing.T, dir, want string) {
	t.Helper()
	logs := captureLog(t)
	damaged := rundir.CheckpointDir(dir, 4)
	var before []string
	_ = filepath.WalkDir(damaged, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(damaged, p)
			before = append(before, rel)
		}
		return nil
	})
	tr, err := New(context.Background(), tinyConfig(t, dir, "warmup.steps=0"), Options{Resume: true})
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	defer tr.Close()
	if tr.step != 2 {
		t.Fatalf("resumed at step %d, want 2 (the newest complete checkpoint)", tr.step)
	}
	if !strings.Contains(logs.String(), want) {
		t.Errorf("the warning does not name %q:\n%s", want, logs)
	}
	if rows := readRows(t, dir); len(rows) != 2 {
		t.Errorf("%d metrics rows after resuming at step 2, want 2", len(rows))
	}
	if n := bytes.Count(readBytes(t, filepath.Join(dir, rundir.DroppedMetricsFile)), []byte("\n")); n != 2 {
		t.Errorf("%s holds %d rows, want the 2 after step 2", rundir.DroppedMetricsFile, n)
	}
	if err := tr.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := rundir.Verify(damaged, 4); err != nil {
		t.Errorf("the resumed run's step-4 is not complete: %v", err)
	}
	var after []string
	aside := damaged + ".damaged"
	_ = filepath.WalkDir(aside, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(aside, p)
			after = append(after, rel)
		}
		return nil
	})
	if !slices.Equal(before, after) {
		t.Errorf("the damaged step-4 was not kept as it was: files %v, then %v in %s", before, after, aside)
	}
}

// A trainer.json that is null, {}, or whose step disagrees with its folder, is negative or is past
// run.steps is damage: the checkpoint is skipped for step-2, never taken as step 0, and no metrics
// row is lost (before: null and {} restarted the run at step 0 over every checkpoint, step 3 in
// step-4 trained on from 3, -5 emptied metrics.jsonl and panicked, 999 ended the run untrained).
// With a manifest the checksum already catches the edit; without one (an older drmas's checkpoint)
// trainer.json's own checks do.
func TestResumeSkipsDamagedTrainerState(t *testing.T) {
	base := trainedRun(t)
	cases := map[string]string{
		"null": "null", "empty": "{}", "disagrees": `{"step": 2, "seed": 1}`, "negative": `{"step": -5}`,
		"past": `{"step": 999}`, "string": `"step-4"`,
	}
	for name, body := range cases {
		for _, legacy := range []bool{false, true} {
			t.Run(name+map[bool]string{false: "", true: "/legacy"}[legacy], func(t *testing.T) {
				dir := copyRun(t, base)
				if legacy {
					removeManifests(t, dir)
				}
				writeFile(t, filepath.Join(rundir.CheckpointDir(dir, 4), "trainer.json"), body)
				resumeFallsBackTo2(t, dir, filepath.Join("step-4", "trainer.json"))
			})
		}
	}
}

// A complete checkpoint past run.steps is refused, not "done" with nothing trained, and nothing is
// cut from the metrics.
func TestResumePastRunStepsRefused(t *testing.T) {
	dir := trainedRun(t)
	before := readBytes(t, filepath.Join(dir, rundir.MetricsFile))
	_, err := New(context.Background(), tinyConfig(t, dir, "warmup.steps=0", "run.steps=3"), Options{Resume: true})
	if err == nil || !strings.Contains(err.Error(), "past run.steps (4 > 3)") {
		t.Fatalf("err = %v, want a refusal naming run.steps", err)
	}
	if !bytes.Equal(before, readBytes(t, filepath.Join(dir, rundir.MetricsFile))) {
		t.Error("metrics.jsonl changed")
	}
}

// Without trainer.json in any checkpoint, --resume is refused (exit 2 in the CLI) and nothing is
// deleted (before: "starting from the beginning", every checkpoint, metrics and reference deleted).
func TestResumeNoTrainerStateRefused(t *testing.T) {
	base := trainedRun(t)
	for _, legacy := range []bool{false, true} {
		dir := copyRun(t, base)
		if legacy {
			removeManifests(t, dir)
		}
		for _, s := range []int{2, 4} {
			if err := os.Remove(filepath.Join(rundir.CheckpointDir(dir, s), "trainer.json")); err != nil {
				t.Fatal(err)
			}
		}
		names := dirNames(t, dir)
		_, err := New(context.Background(), tinyConfig(t, dir, "warmup.steps=0"), Options{Resume: true})
		if !errors.Is(err, rundir.ErrNoCompleteCheckpoint) || !strings.Contains(err.Error(), filepath.Join("step-4", "trainer.json")) ||
			!strings.Contains(err.Error(), filepath.Join("step-2", "trainer.json")) {
			t.Fatalf("legacy %v: err = %v, want rundir.ErrNoCompleteCheckpoint naming both trainer.json", legacy, err)
		}
		after := dirNames(t, dir)
		if !slices.Equal(names, after) {
			t.Errorf("legacy %v: run folder held %v, now %v", legacy, names, after)
		}
		mustExist(t, filepath.Join(rundir.CheckpointDir(dir, 4), "small", "model.safetensors"), filepath.Join(dir, "reference"))
		if rows := readRows(t, dir); len(rows) != 4 {
			t.Errorf("legacy %v: %d metrics rows left, want 4", legacy, len(rows))
		}
	}
}

// A missing optimizer state or weights file, or a garbled config.yaml, in the newest checkpoint
// falls back to the newest complete one, as the README says (before: exit 2 naming the file); bytes
// changed inside the weights, sizes intact, are caught by the checksum (before: resumed, and the
// run died at the next rollout with non-finite logits).
func TestResumeFallsBackPastMissingOrChangedFiles(t *testing.T) {
	base := trainedRun(t)
	small := filepath.Join("step-4", "small")
	damage := map[string]struct {
		do     func(t *testing.T, ck string)
		names  string
		legacy bool // also caught without a manifest
	}{
		"no optim": {func(t *testing.T, ck string) { os.Remove(filepath.Join(ck, "small", "optim.safetensors")) },
			filepath.Join(small, "optim.safetensors"), true},
		"no weights": {func(t *testing.T, ck string) { os.Remove(filepath.Join(ck, "small", "model.safetensors")) },
			filepath.Join(small, "model.safetensors"), true},
		"garbled config": {func(t *testing.T, ck string) { writeFile(t, filepath.Join(ck, "config.yaml"), "models: [[[\n") },
			filepath.Join("step-4", "config.yaml"), true},
		// An optim.index.json that names tensors its partition does not hold (issue #42: before, --resume
		// took the checkpoint and died loading the optimizer, exit 2, no fallback). Its manifest is
		// rewritten to agree, so only the check of the index's contents can catch it.
		"lying optim index": {func(t *testing.T, ck string) {
			writeFile(t, filepath.Join(ck, "small", rundir.OptimIndexFile),
				`{"world_size": 1, "shard": "optimizer", "weight_map": {"exp_avg.model.norm.weight": "optim.safetensors", "exp_avg_sq.model.norm.weight": "optim.safetensors", "exp_avg.lm_head.bias": "optim.safetensors", "exp_avg_sq.lm_head.bias": "optim.safetensors"}}`)
			if _, err := os.Stat(filepath.Join(ck, rundir.ManifestFile)); err == nil {
				if err := rundir.WriteManifest(ck, 4, 1); err != nil {
					t.Fatal(err)
				}
			}
		}, filepath.Join(small, rundir.OptimIndexFile), true},
		// The optimizer state of an older checkpoint copied in, the manifest rewritten to agree (#52:
		// it loaded silently): the file carries the step it belongs to.
		"older optim copied in": {func(t *testing.T, ck string) {
			old := readBytes(t, filepath.Join(rundir.CheckpointDir(filepath.Dir(ck), 2), "small", "optim.safetensors"))
			writeFile(t, filepath.Join(ck, "small", "optim.safetensors"), string(old))
			if err := rundir.WriteManifest(ck, 4, 1); err != nil {
				t.Fatal(err)
			}
		}, filepath.Join(small, "optim.safetensors") + ": drmas.step", false},
		"changed bytes": {func(t *testing.T, ck string) {
			p := filepath.Join(ck, "small", "model.safetensors")
			b := readBytes(t, p)
			b[len(b)-7] ^= 0x40 // inside the last tensor's data: the header still matches the size
			writeFile(t, p, string(b))
		}, filepath.Join(small, "model.safetensors") + ": CRC-32C", false},
	}
	for name, d := range damage {
		for _, legacy := range []bool{false, true} {
			if legacy && !d.legacy {
				continue
			}
			t.Run(name+map[bool]string{false: "", true: "/legacy"}[legacy], func(t *testing.T) {
				dir := copyRun(t, base)
				if legacy {
					removeManifests(t, dir)
				}
				d.do(t, rundir.CheckpointDir(dir, 4))
				resumeFallsBackTo2(t, dir, d.names)
			})
		}
	}
}

// Resuming right after the warm-up checkpoint (step-0) does not run the warm-up again: reference/,
// warmup.json and step-0 are not rewritten and the run equals the uninterrupted one (before: the
// warm-up re-ran on the warmed weights and every metric differed).
func TestResumeAfterWarmupCheckpoint(t *testing.T) {
	whole, parts := t.TempDir(), t.TempDir()
	train(t, tinyConfig(t, whole, "run.steps=2"), Options{})
	warmedUp(t, parts)
	kept := []string{"warmup.json", filepath.Join("reference", "small", "model.safetensors"), filepath.Join("step-0", "trainer.json"),
		filepath.Join("step-0", "small", "model.safetensors")}
	type stamp struct {
		body string
		mod  int64
	}
	stamps := map[string]stamp{}
	for _, k := range kept {
		st, err := os.Stat(filepath.Join(parts, k))
		if err != nil {
			t.Fatal(err)
		}
		stamps[k] = stamp{string(readBytes(t, filepath.Join(parts, k))), st.ModTime().UnixNano()}
	}
	var st rundir.TrainerState
	if b := readBytes(t, filepath.Join(rundir.CheckpointDir(parts, 0), "trainer.json")); !strings.Contains(string(b), `"warmup_done": true`) {
		t.Errorf("step-0's trainer.json does not record the warm-up: %s (%v)", b, st)
	}
	tr := train(t, tinyConfig(t, parts, "run.steps=2"), Options{Resume: true})
	if tr.step != 2 {
		t.Fatalf("resumed run ended at %d, want 2", tr.step)
	}
	sameRows(t, readRows(t, whole), readRows(t, parts))
	for _, k := range kept {
		st, _ := os.Stat(filepath.Join(parts, k))
		if string(readBytes(t, filepath.Join(parts, k))) != stamps[k].body || st.ModTime().UnixNano() != stamps[k].mod {
			t.Errorf("%s was rewritten by the resume", k)
		}
	}
}

// Checkpoints from before manifests (and before warmup_done) still resume, from step-0 too, and
// give the uninterrupted run.
func TestResumeLegacyCheckpoints(t *testing.T) {
	whole, parts := t.TempDir(), t.TempDir()
	train(t, tinyConfig(t, whole, "run.steps=2"), Options{})
	warmedUp(t, parts)
	removeManifests(t, parts)
	ck := rundir.CheckpointDir(parts, 0)
	b := readBytes(t, filepath.Join(ck, "trainer.json"))
	old := strings.Replace(string(b), `"warmup_done": true`, `"legacy": 1`, 1)
	if old == string(b) {
		t.Fatalf("no warmup_done in %s", b)
	}
	writeFile(t, filepath.Join(ck, "trainer.json"), old)
	logs := captureLog(t)
	train(t, tinyConfig(t, parts, "run.steps=2"), Options{Resume: true})
	if !strings.Contains(logs.String(), "no "+rundir.ManifestFile) {
		t.Errorf("no warning that the checkpoint has no manifest:\n%s", logs)
	}
	sameRows(t, readRows(t, whole), readRows(t, parts))
}

// A malformed line in the middle of metrics.jsonl is refused by --resume, naming it, and the file is
// left as it was (before: the line was dropped silently); a last line a crash cut short is moved to
// metrics.dropped.jsonl with a warning, and the resume goes on.
func TestResumeMetricsLines(t *testing.T) {
	base := trainedRun(t)
	dir := copyRun(t, base)
	path := filepath.Join(dir, rundir.MetricsFile)
	lines := strings.SplitAfter(string(readBytes(t, path)), "\n")
	bad := strings.Join(lines[:2], "") + "not a row\n" + strings.Join(lines[2:], "")
	writeFile(t, path, bad)
	_, err := New(context.Background(), tinyConfig(t, dir, "warmup.steps=0"), Options{Resume: true})
	if err == nil || !strings.Contains(err.Error(), rundir.MetricsFile+":3") {
		t.Fatalf("err = %v, want a refusal naming %s:3", err, rundir.MetricsFile)
	}
	if string(readBytes(t, path)) != bad {
		t.Error("metrics.jsonl changed")
	}

	dir = copyRun(t, base)
	path = filepath.Join(dir, rundir.MetricsFile)
	torn := string(readBytes(t, path)) + `{"step":5,"rew`
	writeFile(t, path, torn)
	tr, err := New(context.Background(), tinyConfig(t, dir, "warmup.steps=0", "run.steps=5"), Options{Resume: true})
	if err != nil {
		t.Fatal(err)
	}
	tr.Close()
	if rows := readRows(t, dir); len(rows) != 4 {
		t.Errorf("%d rows, want 4", len(rows))
	}
	if got := string(readBytes(t, filepath.Join(dir, rundir.DroppedMetricsFile))); got != `{"step":5,"rew`+"\n" {
		t.Errorf("%s = %q, want the torn line", rundir.DroppedMetricsFile, got)
	}
}

// Every checkpoint and the KL reference carry a manifest that agrees with their files; the files are
// synced before the folder is renamed into place, and the run folder after.
func TestCheckpointManifestAndSync(t *testing.T) {
	dir := t.TempDir()
	var events []string
	oldTree, oldDir := rundir.SyncTree, rundir.SyncDir
	t.Cleanup(func() { rundir.SyncTree, rundir.SyncDir = oldTree, oldDir })
	rundir.SyncTree = func(p string) error {
		if strings.HasSuffix(p, ".tmp") {
			if _, err := os.Stat(strings.TrimSuffix(p, ".tmp")); err == nil {
				t.Errorf("%s synced after the rename", p)
			}
		}
		events = append(events, "tree "+filepath.Base(p))
		return oldTree(p)
	}
	rundir.SyncDir = func(p string) error {
		events = append(events, "dir "+filepath.Base(p))
		return oldDir(p)
	}
	train(t, tinyConfig(t, dir, "run.steps=2", "warmup.steps=0"), Options{})
	// reference/, metrics.jsonl's name when its first row creates it, the checkpoint
	want := []string{"tree reference", "dir " + filepath.Base(dir), "dir " + filepath.Base(dir), "tree step-2.tmp", "dir " + filepath.Base(dir)}
	if !slices.Equal(events, want) {
		t.Errorf("syncs %v, want %v", events, want)
	}
	for _, ck := range []string{rundir.CheckpointDir(dir, 2), filepath.Join(dir, "reference")} {
		step := 2
		if filepath.Base(ck) == "reference" {
			step = 0
		}
		m, err := rundir.ReadManifest(ck, step)
		if err != nil {
			t.Fatal(err)
		}
		if err := rundir.CheckManifest(ck, m); err != nil {
			t.Error(err)
		}
		names, _ := rundir.ListFiles(ck)
		if len(names) != len(m.Files) {
			t.Errorf("%s: %d files, manifest lists %d", ck, len(names), len(m.Files))
		}
	}
}

// A model saved in shards (models over 5 GB) makes a complete checkpoint too; a missing shard does not.
func TestVerifyShardedCheckpoint(t *testing.T) {
	dir := trainedRun(t)
	ck := rundir.CheckpointDir(dir, 4)
	model := filepath.Join(ck, "small")
	err := torch.Do(func() error {
		m, err := policy.Load(model, gotch.CPU, gotch.Float)
		if err != nil {
			return err
		}
		if err := os.Remove(filepath.Join(model, "model.safetensors")); err != nil {
			return err
		}
		return m.SaveSharded(model, 4096)
	})
	if err != nil {
		t.Fatal(err)
	}
	shards, _ := filepath.Glob(filepath.Join(model, "model-*.safetensors"))
	if len(shards) < 2 {
		t.Fatalf("%d shards, want several", len(shards))
	}
	if err := rundir.WriteManifest(ck, 4, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := rundir.Verify(ck, 4); err != nil {
		t.Fatalf("sharded checkpoint: %v", err)
	}
	removeManifests(t, dir)
	if _, err := rundir.Verify(ck, 4); err != nil {
		t.Fatalf("sharded checkpoint without a manifest: %v", err)
	}
	if err := os.Remove(shards[1]); err != nil {
		t.Fatal(err)
	}
	if _, err := rundir.Verify(ck, 4); err == nil || !strings.Contains(err.Error(), shards[1]) {
		t.Fatalf("err = %v, want the missing shard named", err)
	}
}

// A damaged checkpoint at a step the resumed run never saves again (here step-3 with checkpoints
// every 2 steps after the resume) is kept aside at once and never pruned (before: keep_last counted
// it and deleted it with the old ones).
func TestSkippedCheckpointIsNotPruned(t *testing.T) {
	dir := t.TempDir()
	train(t, tinyConfig(t, dir, "warmup.steps=0", "run.steps=3", "run.save_every=1"), Options{})
	if err := os.Remove(filepath.Join(rundir.CheckpointDir(dir, 3), "small", "optim.safetensors")); err != nil {
		t.Fatal(err)
	}
	train(t, tinyConfig(t, dir, "warmup.steps=0", "run.steps=6", "run.save_every=2", "run.keep_last=1"), Options{Resume: true})
	if _, err := os.Stat(rundir.CheckpointDir(dir, 3) + ".damaged"); err != nil {
		t.Fatalf("the damaged step-3 is gone: %v", err)
	}
	if _, err := os.Stat(filepath.Join(rundir.CheckpointDir(dir, 3)+".damaged", "small", "model.safetensors")); err != nil {
		t.Fatalf("the damaged step-3 lost its files: %v", err)
	}
	steps, err := rundir.Steps(dir)
	if err != nil || !slices.Equal(steps, []int{6}) {
		t.Fatalf("checkpoints %v (%v), want [6] (keep_last 1)", steps, err)
	}
}

// A frozen base hard-linked from the previous checkpoint counts as intact only while its files have
// the sizes and CRC-32Cs that checkpoint's manifest recorded: a file changed on disk since (here
// rewritten in place, which every link sees) is caught, so the base is written again from memory
// rather than carried into the new checkpoint.
func TestLinkedBaseCheckedAgainstPreviousManifest(t *testing.T) {
	root := t.TempDir()
	prev := filepath.Join(root, "step-2")
	weights := filepath.Join(prev, "toy", "model.safetensors")
	if err := os.MkdirAll(filepath.Dir(weights), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{"toy/model.safetensors": "weights v1", "toy/config.json": "{}", "trainer.json": "{}"} {
		if err := os.WriteFile(filepath.Join(prev, filepath.FromSlash(name)), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := rundir.WriteManifest(prev, 2, 1); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(root, "step-4.tmp")
	if !rundir.LinkFiles(filepath.Join(prev, "toy"), filepath.Join(tmp, "toy")) {
		t.Fatal("rundir.LinkFiles did not link")
	}
	if err := rundir.WriteManifest(tmp, 4, 1); err != nil {
		t.Fatal(err)
	}
	if !rundir.LinkedIntact(tmp, filepath.Join(prev, "toy"), "toy", 4) {
		t.Fatal("an unchanged linked base is not intact")
	}
	if err := os.WriteFile(weights, []byte("weights v2"), 0o644); err != nil { // in place: the link sees it too
		t.Fatal(err)
	}
	if err := rundir.WriteManifest(tmp, 4, 1); err != nil {
		t.Fatal(err)
	}
	if rundir.LinkedIntact(tmp, filepath.Join(prev, "toy"), "toy", 4) {
		t.Error("a linked base changed on disk since the previous checkpoint counts as intact")
	}
	if rundir.LinkFiles("", filepath.Join(root, "x")) || rundir.LinkFiles(filepath.Join(root, "none"), filepath.Join(root, "y")) {
		t.Error("rundir.LinkFiles linked from nothing")
	}
	if _, err := os.Stat(filepath.Join(root, "y")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a failed link left its folder: %v", err)
	}
}

// dirNames lists a folder's entries.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}
