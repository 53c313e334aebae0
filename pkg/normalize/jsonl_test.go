package normalize

import (
	"bytes"
	"errors"
	"os"
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
