package tbevent

import (
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"testing"
	"time"
)

// An independent reader (npm tfrecord 0.2: TFRecord framing, both CRCs checked; protobufjs decoding
// the Event message declared with TensorFlow's field numbers; installed by scripts/tfrecord-node.sh
// into .cache/tfrecord-node, or DRMAS_TFRECORD_NODE) reads what Create and Write wrote, pruned too.
// Skipped, saying why, without node or the package.
func TestIndependentReader(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not found: the independent event-file reader needs Node.js and scripts/tfrecord-node.sh")
	}
	dir := os.Getenv("DRMAS_TFRECORD_NODE")
	if dir == "" {
		dir = "../../.cache/tfrecord-node"
	}
	if _, err := os.Stat(dir + "/node_modules/tfrecord/package.json"); err != nil {
		t.Skipf("npm tfrecord is not installed in %s: run scripts/tfrecord-node.sh (make test does)", dir)
	}
	now := time.Unix(1700000000, 500_000_000)
	w, err := Create(t.TempDir(), now)
	if err != nil {
		t.Fatal(err)
	}
	h, _ := NewHistogram([]float64{-2, -1, 0, 0, 3}, 5)
	text := "### trajectory 1\n\n**searcher** → `<search>Paris</search>` ✓"
	for s := int64(1); s <= 4; s++ {
		vals := []Value{Scalar("reward/mean", float64(s)/4), Scalar("grad_norm/agent/a", math.NaN())}
		if s == 2 {
			vals = append(vals, Text("transcripts", text), Histo("adv/a", h))
		}
		if err := w.Write(s, now.Add(time.Duration(s)*time.Second), vals...); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	if _, err := Prune(w.dir(), 3); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(node, "../../scripts/tbevent-check.cjs", w.Path())
	cmd.Env = append(os.Environ(), "TFRECORD_NODE="+dir)
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("tbevent-check: %v\n%s", err, ee.Stderr)
		}
		t.Fatal(err)
	}
	type value struct {
		Tag    string   `json:"tag"`
		Simple any      `json:"simple_value"`
		Plugin string   `json:"plugin"`
		DType  int      `json:"dtype"`
		Shape  []int    `json:"shape"`
		Text   []string `json:"text"`
		Histo  *struct {
			Min, Max, Num, Sum float64
			SumSquares         float64   `json:"sumSquares"`
			BucketLimit        []float64 `json:"bucketLimit"`
			Bucket             []float64 `json:"bucket"`
		} `json:"histo"`
	}
	type event struct {
		WallTime    float64 `json:"wall_time"`
		Step        int64   `json:"step"`
		FileVersion string  `json:"file_version"`
		Writer      string  `json:"writer"`
		Values      []value `json:"values"`
	}
	var got map[string][]event
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	evs := got[w.Path()]
	if len(evs) != 4 {
		t.Fatalf("%d events, want the header and steps 1-3: %s", len(evs), out)
	}
	if evs[0].FileVersion != FileVersion || evs[0].Writer != WriterName || evs[0].WallTime != 1700000000.5 {
		t.Fatalf("header %+v", evs[0])
	}
	for i, e := range evs[1:] {
		s := int64(i + 1)
		if e.Step != s || e.WallTime != 1700000000.5+float64(s) {
			t.Fatalf("event %d: step %d wall %v", i+1, e.Step, e.WallTime)
		}
		if v := e.Values[0]; v.Tag != "reward/mean" || v.Simple != float64(s)/4 {
			t.Fatalf("step %d: %+v", s, v)
		}
		if v := e.Values[1]; v.Simple != "NaN" {
			t.Fatalf("step %d: non-finite scalar %+v", s, v)
		}
		if s != 2 {
			continue
		}
		if len(e.Values) != 4 {
			t.Fatalf("step 2: %+v", e.Values)
		}
		tx := e.Values[2]
		if tx.Tag != "transcripts" || tx.Plugin != "text" || tx.DType != 7 || len(tx.Shape) != 1 || tx.Shape[0] != 1 ||
			len(tx.Text) != 1 || tx.Text[0] != text {
			t.Fatalf("text %+v", tx)
		}
		hv := e.Values[3].Histo
		if hv == nil || hv.Min != -2 || hv.Max != 3 || hv.Num != 5 || hv.Sum != 0 || hv.SumSquares != 14 ||
			!equal(hv.BucketLimit, h.BucketLimit) || !equal(hv.Bucket, h.Bucket) {
			t.Fatalf("histogram %+v", hv)
		}
	}
}
