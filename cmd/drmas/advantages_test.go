package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/drmas/drmas/pkg/normalize"
)

const exampleFile = "../../pkg/normalize/testdata/samples.jsonl"

// runDrmas runs the root command with args and returns stdout, stderr and the error.
func runDrmas(t *testing.T, stdin string, args ...string) (string, string, error) {
	t.Helper()
	root := newRootCmd()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetIn(strings.NewReader(stdin))
	root.SetArgs(append([]string{"--log-level", "error"}, args...))
	err := root.Execute()
	return out.String(), errOut.String(), err
}

// outputLines parses the command's output lines as JSON objects.
func outputLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	for i, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("output line %d %q: %v", i+1, line, err)
		}
		lines = append(lines, m)
	}
	return lines
}

func exampleSamples(t *testing.T) []normalize.Sample {
	t.Helper()
	f, err := os.Open(exampleFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	samples, err := normalize.ReadSamples(f, exampleFile)
	if err != nil {
		t.Fatal(err)
	}
	return samples
}

func TestAdvantagesDefaultIsDrMAS(t *testing.T) {
	out, stderr, err := runDrmas(t, "", "advantages", "--input", exampleFile)
	if err != nil {
		t.Fatal(err)
	}
	want, err := normalize.Compute(exampleSamples(t), normalize.DrMAS())
	if err != nil {
		t.Fatal(err)
	}
	lines := outputLines(t, out)
	if len(lines) != len(want.Advantages) {
		t.Fatalf("%d lines, want %d", len(lines), len(want.Advantages))
	}
	for i, m := range lines {
		if m["advantage"] != want.Advantages[i] {
			t.Errorf("line %d: advantage %v, want %v", i+1, m["advantage"], want.Advantages[i])
		}
		if _, ok := m["turn"]; !ok {
			t.Errorf("line %d lost its other fields: %v", i+1, m)
		}
	}
	// The table on stderr: agents sorted, with the inflation factors.
	for _, s := range []string{"inflation", "answerer", "searcher", "verifier", "frac_zero_std 0.3333"} {
		if !strings.Contains(stderr, s) {
			t.Errorf("stderr lacks %q:\n%s", s, stderr)
		}
	}
	if a, s := strings.Index(stderr, "answerer"), strings.Index(stderr, "searcher"); a > s {
		t.Errorf("agents not sorted:\n%s", stderr)
	}
}

func TestAdvantagesFilesAndFlags(t *testing.T) {
	dir := t.TempDir()
	output, stats := filepath.Join(dir, "out.jsonl"), filepath.Join(dir, "stats.json")
	stdout, stderr, err := runDrmas(t, "", "advantages", "--input", exampleFile, "--preset", "grpo",
		"--population-std", "--min-std", "0.01", "--output", output, "--stats-json", stats)
	if err != nil {
		t.Fatal(err)
	}
	if stdout != "" || stderr != "" {
		t.Errorf("stdout %q stderr %q, want both empty when writing files", stdout, stderr)
	}
	data, err := os.ReadFile(output)
	if err != nil {
		t.Fatal(err)
	}
	opt := normalize.GRPO()
	opt.Unbiased, opt.MinStd = false, 0.01
	want, err := normalize.Compute(exampleSamples(t), opt)
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range outputLines(t, string(data)) {
		if m["advantage"] != want.Advantages[i] {
			t.Errorf("line %d: advantage %v, want %v", i+1, m["advantage"], want.Advantages[i])
		}
	}
	var got struct {
		Options       normalize.Options `json:"options"`
		Samples       int               `json:"samples"`
		MinStdApplied int               `json:"min_std_applied"`
		Agents        []struct {
			Agent     string   `json:"agent"`
			Inflation *float64 `json:"inflation"`
		} `json:"agents"`
		PerGroup []normalize.GroupStats `json:"per_group"`
	}
	data, err = os.ReadFile(stats)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if got.Options.String() != opt.String() || got.Samples != 20 || got.MinStdApplied != 1 || len(got.PerGroup) != 2 {
		t.Errorf("stats %+v", got)
	}
	if len(got.Agents) != 3 || got.Agents[0].Agent != "answerer" || got.Agents[0].Inflation == nil ||
		math.Abs(*got.Agents[0].Inflation-want.Stats.Agents[0].Inflation) > 1e-12 {
		t.Errorf("agents %+v", got.Agents)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("temporary files left behind: %v", entries)
	}
}

func TestAdvantagesCombos(t *testing.T) {
	opt := normalize.DrMAS()
	opt.Mean, opt.Std, opt.Weighting, opt.Eps = normalize.Global, normalize.None, normalize.Trajectory, 0.5
	want, err := normalize.Compute(exampleSamples(t), opt)
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := runDrmas(t, "", "advantages", "--input", exampleFile, "--mean", "global", "--std", "none", "--weighting", "trajectory", "--eps", "0.5")
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range outputLines(t, out) {
		if m["advantage"] != want.Advantages[i] {
			t.Errorf("line %d: advantage %v, want %v", i+1, m["advantage"], want.Advantages[i])
		}
	}
}

func TestAdvantagesStdin(t *testing.T) {
	in := `{"uid":"q","traj_uid":"a","agent":"s","score":1}
{"uid":"q","traj_uid":"b","agent":"s","score":0,"advantage":null}
`
	out, _, err := runDrmas(t, in, "advantages", "--input", "-", "--eps", "0.5", "--std", "none")
	if err != nil {
		t.Fatal(err)
	}
	want := `{"uid":"q","traj_uid":"a","agent":"s","score":1,"advantage":0.5}
{"uid":"q","traj_uid":"b","agent":"s","score":0,"advantage":-0.5}
`
	if out != want {
		t.Errorf("output\n%s\nwant\n%s", out, want)
	}
}

func TestAdvantagesBadInput(t *testing.T) {
	good := `{"uid":"q","traj_uid":"a","agent":"s","score":1}` + "\n"
	tests := []struct {
		name, input string
		args        []string
		want        string
	}{
		{"malformed line", good + good + `{"uid":"q",` + "\n", nil, "samples.jsonl:3: malformed JSON"},
		{"missing field", good + `{"uid":"q","traj_uid":"b","score":0}` + "\n", nil, `samples.jsonl:2: missing field "agent"`},
		{"non-finite score", good + "\n" + `{"uid":"q","traj_uid":"b","agent":"s","score":NaN}`, nil, `samples.jsonl:3: field "score": not a finite number`},
		{"overflowing score", `{"uid":"q","traj_uid":"b","agent":"s","score":-1e999}`, nil, `samples.jsonl:1: field "score": -1e999 is not a finite number`},
		{"bad mean", good, []string{"--mean", "team"}, `mean "team": want global or agent`},
		{"bad preset", good, []string{"--preset", "ppo"}, `normalization options: normalization preset "ppo"`},
		{"bad eps", good, []string{"--eps", "0"}, "eps 0"},
		{"negative min-std", good, []string{"--min-std", "-0.1"}, "min_std -0.1"},
		{"unknown flag", good, []string{"--baseline", "x"}, "unknown flag: --baseline"},
		{"empty input", "", nil, "samples.jsonl: no samples"},
		{"blank lines only", "\n\n", nil, "samples.jsonl: no samples"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			input, output, stats := filepath.Join(dir, "samples.jsonl"), filepath.Join(dir, "out.jsonl"), filepath.Join(dir, "stats.json")
			if err := os.WriteFile(input, []byte(tt.input), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(output, []byte("previous\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			args := append([]string{"advantages", "--input", input, "--output", output, "--stats-json", stats}, tt.args...)
			stdout, _, err := runDrmas(t, "", args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
			var ue usageError
			if !errors.As(err, &ue) {
				t.Errorf("error %v is not a usage error (exit 2)", err)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			if data, _ := os.ReadFile(output); string(data) != "previous\n" {
				t.Errorf("output file changed to %q", data)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 2 {
				t.Errorf("files written on failure: %v", entries)
			}
		})
	}
}

func TestAdvantagesNeedsInput(t *testing.T) {
	_, _, err := runDrmas(t, "", "advantages")
	var ue usageError
	if err == nil || !errors.As(err, &ue) || !strings.Contains(err.Error(), "--input is required") {
		t.Errorf("error %v", err)
	}
	_, _, err = runDrmas(t, "", "advantages", "--input", filepath.Join(t.TempDir(), "missing.jsonl"))
	if err == nil || !errors.As(err, &ue) || !strings.Contains(err.Error(), "missing.jsonl") {
		t.Errorf("error %v", err)
	}
}

// Every line of the command's Example runs, from a folder laid out like the repository.
func TestAdvantagesExamplesRun(t *testing.T) {
	data, err := os.ReadFile(exampleFile)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "pkg/normalize/testdata"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pkg/normalize/testdata/samples.jsonl"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	examples := strings.Split(strings.TrimSpace(newAdvantagesCmd().Example), "\n")
	if len(examples) < 3 {
		t.Fatalf("only %d examples", len(examples))
	}
	for _, line := range examples {
		args := strings.Fields(line)
		if args[0] != "drmas" {
			t.Fatalf("example %q does not start with drmas", line)
		}
		if _, _, err := runDrmas(t, "", args[1:]...); err != nil {
			t.Errorf("example %q: %v", line, err)
		}
	}
	for _, f := range []string{"grpo.jsonl", "grpo-stats.json", "drmas.jsonl"} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("example output %s: %v", f, err)
		}
	}
}

// TestAdvantagesMemoryIsBounded runs `drmas advantages` as a child process on a 100 MB samples file
// and on a tiny one: the large input may add little to the peak resident memory (the records are read
// back group by group, never held; the old reader held every line, 3× the file).
func TestAdvantagesMemoryIsBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("writes a 100 MB file")
	}
	dir := t.TempDir()
	pad := strings.Repeat("x", 300)
	write := func(name string, groups int) string {
		path := filepath.Join(dir, name)
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		w := bufio.NewWriter(f)
		for g := 0; g < groups; g++ {
			for c := 0; c < 16; c++ {
				fmt.Fprintf(w, `{"uid":"u%d","traj_uid":"t%d","agent":"a%d","score":%d,"note":"%s"}`+"\n", g, c/2, c%2, (g+c)%3, pad)
			}
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		f.Close()
		return path
	}
	peak := func(input string) int64 {
		cmd := drmasCmd(t, nil, "advantages", "--input", input, "--output", input+".out", "--stats-json", input+".stats")
		run(t, cmd)
		return cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss << 10
	}
	small, large := write("small.jsonl", 1), write("large.jsonl", 20000)
	st, _ := os.Stat(large)
	base, big := peak(small), peak(large)
	t.Logf("peak resident: %d MB on 16 lines, %d MB on %d lines (%d MB)", base>>20, big>>20, 16*20000, st.Size()>>20)
	if big-base > st.Size()/2 {
		t.Fatalf("a %d MB input added %d MB to the peak resident memory", st.Size()>>20, (big-base)>>20)
	}
}
