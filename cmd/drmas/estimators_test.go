package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/normalize"
)

func TestEstimatorsTable(t *testing.T) {
	out, _, err := runDrmas(t, "", "estimators", "--input", exampleFile)
	if err != nil {
		t.Fatal(err)
	}
	// One row per agent and estimator, under the header.
	rows := 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 10 && (f[0] == "verifier" || f[0] == "searcher" || f[0] == "answerer") {
			rows++
		}
	}
	if rows != 3*len(normalize.Presets()) {
		t.Errorf("%d rows, want %d:\n%s", rows, 3*len(normalize.Presets()), out)
	}
	for _, want := range []string{"energy/drmas", "samples 20, groups 2, trajectories 6", "at-grpo: mean=agent std=agent weighting=step group=agent-turn"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// --json gives the comparison; its figures are Compare's on the same samples, and Dr. MAS's ratio to
// itself is 1.
func TestEstimatorsJSON(t *testing.T) {
	out, _, err := runDrmas(t, "", "estimators", "--input", exampleFile, "--estimator", "grpo-call",
		"--estimator", "drmas", "--estimator", "drmas+searcher=grpo", "--min-std", "0.05", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Base       string
		Estimators []struct {
			Name   string
			Agents []struct {
				Agent       string
				Energy      float64
				EnergyRatio *float64 `json:"energy_ratio"`
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	base := normalize.DrMAS()
	base.MinStd = 0.05
	e, err := normalize.ParseEstimator("drmas+searcher=grpo", base)
	if err != nil {
		t.Fatal(err)
	}
	want, err := normalize.Compare(exampleSamples(t), []normalize.Estimator{e, {Name: "drmas", Options: base}}, "drmas")
	if err != nil {
		t.Fatal(err)
	}
	if got.Base != "drmas" || len(got.Estimators) != 3 || got.Estimators[2].Name != "drmas+searcher=grpo" {
		t.Fatalf("comparison %+v", got)
	}
	for i, a := range got.Estimators[2].Agents {
		w := want.Estimators[0].Agents[i]
		if a.Agent != w.Agent || math.Abs(a.Energy-w.Energy) > 1e-9 || a.EnergyRatio == nil || math.Abs(*a.EnergyRatio-w.EnergyRatio) > 1e-9 {
			t.Errorf("agent %+v, want %+v", a, w)
		}
	}
	for _, a := range got.Estimators[1].Agents {
		if a.EnergyRatio == nil || *a.EnergyRatio != 1 {
			t.Errorf("drmas ratio to itself: %+v", a)
		}
	}
}

// A training rollout dump is read as it is: its lines carry uid and score.
func TestEstimatorsReadRolloutDump(t *testing.T) {
	roll := &env.Rollout{Trajectories: []env.Trajectory{
		{UID: "q1", TrajUID: "q1-0", TaskID: "q1", Reward: 1, Calls: []env.Call{{Agent: "verifier", Turn: 1, Valid: true, Score: 1}, {Agent: "answerer", Turn: 1, Valid: true, Score: 1}}},
		{UID: "q1", TrajUID: "q1-1", TaskID: "q1", Sample: 1, Calls: []env.Call{{Agent: "verifier", Turn: 1, Valid: true, Score: 0}, {Agent: "searcher", Turn: 1, Score: -0.01}}},
	}}
	var b bytes.Buffer
	if err := env.WriteTranscripts(&b, "train", roll, nil); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "step-1.jsonl")
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err := runDrmas(t, "", "estimators", "--input", path, "--estimator", "grpo", "--estimator", "drmas", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var got normalize.Comparison
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if got.Samples != 4 || got.Groups != 1 || got.Trajectories != 2 {
		t.Errorf("read %d samples, %d groups, %d trajectories from the dump; want 4, 1, 2", got.Samples, got.Groups, got.Trajectories)
	}
}

func TestEstimatorsErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonl")
	if err := os.WriteFile(bad, []byte("{\"uid\": \"q\", \"traj_uid\": \"t\", \"agent\": \"a\", \"score\": 1}\n{\"uid\": \"q\", \"agent\": \"a\", \"score\": 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"estimators"}, "--input is required"},
		{[]string{"estimators", "--input", bad}, bad + `:2: missing field "traj_uid"`},
		{[]string{"estimators", "--input", exampleFile, "--estimator", "ppo"}, `--estimator: estimator "ppo"`},
		{[]string{"estimators", "--input", exampleFile, "--estimator", "grpo", "--base", "drmas"}, `--base "drmas": not one of the estimators`},
		{[]string{"estimators", "--input", exampleFile, "--eps", "0"}, "eps 0"},
		{[]string{"estimators", "--input", filepath.Join(dir, "none.jsonl")}, "open input"},
	} {
		_, _, err := runDrmas(t, "", tt.args...)
		var ue usageError
		if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.As(err, &ue) {
			t.Errorf("%v: error %v, want exit 2 with %q", tt.args, err, tt.want)
		}
	}
}

// `drmas advantages` exposes the new presets, --group/--global and per-agent overrides.
func TestAdvantagesNewEstimators(t *testing.T) {
	samples := exampleSamples(t)
	for _, tt := range []struct {
		args []string
		opt  func() normalize.Options
	}{
		{[]string{"--preset", "at-grpo"}, normalize.ATGRPO},
		{[]string{"--preset", "role-baseline"}, normalize.RoleBaseline},
		{[]string{"--preset", "grpo-call"}, normalize.GRPOCall},
		{[]string{"--preset", "grpo", "--global", "call"}, normalize.GRPOCall},
		{[]string{"--group", "agent-turn"}, normalize.ATGRPO},
		{[]string{"--agent", "searcher=grpo"}, func() normalize.Options {
			o, _ := normalize.DrMAS().WithAgent("searcher", "grpo")
			return o
		}},
	} {
		out, _, err := runDrmas(t, "", append([]string{"advantages", "--input", exampleFile}, tt.args...)...)
		if err != nil {
			t.Fatalf("%v: %v", tt.args, err)
		}
		res, err := normalize.Compute(samples, tt.opt())
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range outputLines(t, out) {
			if got := line["advantage"].(float64); math.Abs(got-res.Advantages[i]) > 1e-12 {
				t.Fatalf("%v: line %d advantage %g, want %g", tt.args, i+1, got, res.Advantages[i])
			}
		}
	}
	_, _, err := runDrmas(t, "", "advantages", "--input", exampleFile, "--agent", "searcher")
	if err == nil || !strings.Contains(err.Error(), `--agent "searcher": want agent=preset`) {
		t.Errorf("bad --agent: %v", err)
	}
}

// The samples streamed from stdin (copied to a temporary file, as drmas advantages does) give the
// output a file gives.
func TestEstimatorsStdin(t *testing.T) {
	data, err := os.ReadFile(exampleFile)
	if err != nil {
		t.Fatal(err)
	}
	fromFile, _, err := runDrmas(t, "", "estimators", "--input", exampleFile, "--json")
	if err != nil {
		t.Fatal(err)
	}
	fromStdin, _, err := runDrmas(t, string(data), "estimators", "--input", "-", "--json")
	if err != nil {
		t.Fatal(err)
	}
	if fromFile != fromStdin {
		t.Errorf("stdin gives\n%s\na file gives\n%s", fromStdin, fromFile)
	}
}
