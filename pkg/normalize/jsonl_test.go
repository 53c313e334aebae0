package normalize

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const good = `{"uid":"q","traj_uid":"t","agent":"a","score":1}`

func TestReadRecordsErrors(t *testing.T) {
	tests := []struct {
		name, input, want string
	}{
		{"malformed", good + "\n{\"uid\":\"q\",", `samples.jsonl:2: malformed JSON`},
		{"trailing data", good + " x", `samples.jsonl:1: malformed JSON: `},
		{"two objects", good + good, `samples.jsonl:1: malformed JSON: data after the object`},
		{"not an object", good + "\n\n[1, 2]", `samples.jsonl:3: want a JSON object, got an array`},
		{"missing agent", good + "\n" + good + "\n" + `{"uid":"q","traj_uid":"t","score":1}`, `samples.jsonl:3: missing field "agent"`},
		{"missing score", `{"uid":"q","traj_uid":"t","agent":"a"}`, `samples.jsonl:1: missing field "score"`},
		{"NaN score", `{"uid":"q","traj_uid":"t","agent":"a","score": NaN}`, `samples.jsonl:1: field "score": not a finite number`},
		{"-Infinity score", `{"uid":"q","traj_uid":"t","agent":"a","score":-Infinity}`, `samples.jsonl:1: field "score": not a finite number`},
		{"overflowing score", `{"uid":"q","traj_uid":"t","agent":"a","score":1e400}`, `samples.jsonl:1: field "score": 1e400 is not a finite number`},
		{"huge score", `{"uid":"q","traj_uid":"t","agent":"a","score":-2e50}`, `samples.jsonl:1: field "score": -2e50 is beyond ±1e+50`},
		{"string score", `{"uid":"q","traj_uid":"t","agent":"a","score":"0.5"}`, `field "score": want a number, got a string`},
		{"null score", `{"uid":"q","traj_uid":"t","agent":"a","score":null}`, `field "score": want a number, got null`},
		{"numeric agent", `{"uid":"q","traj_uid":"t","agent":3,"score":1}`, `field "agent": want a string, got a number`},
		{"object uid", `{"uid":{},"traj_uid":"t","agent":"a","score":1}`, `field "uid": want a string or a number, got an object`},
		{"empty agent", `{"uid":"q","traj_uid":"t","agent":"","score":1}`, `field "agent" is empty`},
		{"duplicate", `{"uid":"q","traj_uid":"t","agent":"a","score":1,"score":2}`, `duplicate field "score"`},
		{"NaN elsewhere", `{"uid":"q","traj_uid":"t","agent":"a","score":1,"reward":NaN}`, `samples.jsonl:1: malformed JSON`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadRecords(strings.NewReader(tt.input), "samples.jsonl")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
			var le *LineError
			if !errors.As(err, &le) || le.Name != "samples.jsonl" {
				t.Errorf("error %v is not a *LineError", err)
			}
		})
	}
}

func TestReadRecords(t *testing.T) {
	input := "\ufeff" + `{"uid": 17, "traj_uid": "17-0", "agent": "solver", "score": -0.1, "prompt": "x\ny"}` + "\r\n\n  \n" +
		`{"agent":"verifier","score":1e-3,"traj_uid":2.50,"uid":"q"}`
	recs, err := ReadRecords(strings.NewReader(input), "in.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	want := []Sample{{UID: "17", TrajUID: "17-0", Agent: "solver", Score: -0.1}, {UID: "q", TrajUID: "2.50", Agent: "verifier", Score: 0.001}}
	if len(recs) != 2 || recs[0].Sample != want[0] || recs[1].Sample != want[1] {
		t.Fatalf("records %+v, want %+v", recs, want)
	}
	if recs[0].Line != 1 || recs[1].Line != 4 {
		t.Errorf("lines %d, %d; want 1, 4", recs[0].Line, recs[1].Line)
	}
	samples, err := ReadSamples(strings.NewReader(input), "in.jsonl")
	if err != nil || len(samples) != 2 || samples[1] != want[1] {
		t.Errorf("ReadSamples = %+v, %v", samples, err)
	}
}

func TestWriteRecordsKeepsLines(t *testing.T) {
	input := `{"uid": "q", "traj_uid": "t1", "agent": "a", "score": 1, "meta": {"turn": 2, "text": "é<b>"}}
{"advantage": 99.5 , "uid":"q","traj_uid":"t2","agent":"a","score":0}
{"uid":"q","traj_uid":"t3","agent":"a","score":0,"advantage":[1,2]}
`
	recs, err := ReadRecords(strings.NewReader(input), "in.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := WriteRecords(&out, recs, []float64{1.5, -0.25, 1e-7}); err != nil {
		t.Fatal(err)
	}
	want := `{"uid": "q", "traj_uid": "t1", "agent": "a", "score": 1, "meta": {"turn": 2, "text": "é<b>"},"advantage":1.5}
{"advantage": -0.25 , "uid":"q","traj_uid":"t2","agent":"a","score":0}
{"uid":"q","traj_uid":"t3","agent":"a","score":0,"advantage":1e-07}
`
	if out.String() != want {
		t.Errorf("output\n%s\nwant\n%s", out.String(), want)
	}
	if err := WriteRecords(&out, recs, []float64{1}); err == nil {
		t.Error("mismatched lengths accepted")
	}
}

// The example file of the command's help reads and normalizes.
func TestExampleFile(t *testing.T) {
	f, err := os.Open("testdata/samples.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	samples, err := ReadSamples(f, "testdata/samples.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if got := searchTeam(); len(samples) != len(got) {
		t.Fatalf("%d samples, want %d", len(samples), len(got))
	} else {
		for i := range got {
			if samples[i] != got[i] {
				t.Errorf("sample %d: %+v, want %+v", i, samples[i], got[i])
			}
		}
	}
}

// TestSamplesFileMatchesCompute: the file path (ScanSamples, then Advantages group by group) writes
// the bytes WriteRecords writes for Compute's advantages on ReadRecords' samples, and the same
// statistics, for contiguous and interleaved groups, every preset and an agent override.
func TestSamplesFileMatchesCompute(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	var contiguous, interleaved strings.Builder
	contiguous.WriteString("\xef\xbb\xbf")
	type line struct {
		uid  int
		text string
	}
	var lines []line
	for g := 0; g < 60; g++ {
		uid := fmt.Sprintf(`"q%d"`, g)
		if g%5 == 0 {
			uid = strconv.Itoa(g) // a number, kept as written
		}
		for tr := 0; tr < 1+rng.IntN(4); tr++ {
			for c := 0; c < 1+rng.IntN(5); c++ {
				agent := []string{"solver", "verifier", "searcher"}[rng.IntN(3)]
				score := float64(rng.IntN(3)) - 0.25*float64(rng.IntN(2))
				text := fmt.Sprintf(`{"uid":%s,"traj_uid":"t%d","agent":%q,"score":%g,"turn":%d}`, uid, tr, agent, score, c)
				if rng.IntN(7) == 0 {
					text = fmt.Sprintf(`{"advantage": 9, "uid":%s,"traj_uid":"t%d","agent":%q,"score":%g}`, uid, tr, agent, score)
				}
				lines = append(lines, line{g, text})
			}
		}
	}
	for i, l := range lines {
		contiguous.WriteString(l.text + "\n")
		if i%17 == 0 {
			contiguous.WriteString("\n  \n")
		}
	}
	rng.Shuffle(len(lines), func(i, j int) { lines[i], lines[j] = lines[j], lines[i] })
	for _, l := range lines {
		interleaved.WriteString(l.text + "\r\n")
	}
	opts := map[string]Options{}
	for _, p := range Presets() {
		o, err := Preset(p)
		if err != nil {
			t.Fatal(err)
		}
		opts[p] = o
	}
	mixed, err := DrMAS().WithAgent("searcher", "at-grpo")
	if err != nil {
		t.Fatal(err)
	}
	opts["drmas+searcher=at-grpo"] = mixed
	for name, input := range map[string]string{"contiguous": contiguous.String(), "interleaved": interleaved.String()} {
		for oname, opt := range opts {
			recs, err := ReadRecords(strings.NewReader(input), "s.jsonl")
			if err != nil {
				t.Fatal(err)
			}
			samples := make([]Sample, len(recs))
			for i := range recs {
				samples[i] = recs[i].Sample
			}
			want, err := Compute(samples, opt)
			if err != nil {
				t.Fatal(err)
			}
			var wantOut bytes.Buffer
			if err := WriteRecords(&wantOut, recs, want.Advantages); err != nil {
				t.Fatal(err)
			}
			sf, err := ScanSamples(strings.NewReader(input), int64(len(input)), "s.jsonl")
			if err != nil {
				t.Fatal(err)
			}
			if sf.contiguous != (name == "contiguous") || sf.Len() != len(recs) {
				t.Fatalf("%s: contiguous %v, %d records", name, sf.contiguous, sf.Len())
			}
			for _, groupStats := range []bool{true, false} {
				var got bytes.Buffer
				st, err := sf.Advantages(&got, opt, groupStats)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got.Bytes(), wantOut.Bytes()) {
					t.Errorf("%s, %s: output differs from Compute's", name, oname)
				}
				ws := want.Stats
				if !groupStats {
					ws.PerGroup = []GroupStats{}
				}
				a, _ := json.MarshalIndent(ws, "", "  ")
				var b bytes.Buffer
				if err := WriteStatsJSON(&b, st); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(append(a, '\n'), b.Bytes()) {
					t.Errorf("%s, %s (group statistics %v): statistics differ:\n%s\n%s", name, oname, groupStats, a, b.Bytes())
				}
			}
		}
	}
}

// TestSamplesFileNoticesChanges: a file that changes between the reads is an error, not output
// mixed from two files.
func TestSamplesFileNoticesChanges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.jsonl")
	a := `{"uid":"q","traj_uid":"t","agent":"a","score":1}` + "\n" + `{"uid":"q","traj_uid":"u","agent":"a","score":0}` + "\n"
	if err := os.WriteFile(path, []byte(a), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sf, err := ScanSamples(f, int64(len(a)), path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(a, `"q"`, `"r"`)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := sf.Advantages(io.Discard, DrMAS(), true); err == nil || !strings.Contains(err.Error(), "the file changed") {
		t.Fatalf("err = %v, want one saying the file changed", err)
	}
}
