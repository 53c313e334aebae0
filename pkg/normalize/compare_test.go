package normalize

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// comparisonBytes is what drmas estimators writes for c: the JSON (--json) and the table.
func comparisonBytes(t *testing.T, c Comparison) (js, table []byte) {
	t.Helper()
	var a, b bytes.Buffer
	enc := json.NewEncoder(&a)
	enc.SetIndent("", "  ")
	if err := enc.Encode(c); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	return a.Bytes(), b.Bytes()
}

// CompareFile (the samples streamed a group at a time through every estimator, drmas estimators)
// gives byte for byte the JSON and the table that Compare gives on ReadRecords' samples (the samples
// held, as drmas estimators did before), on random batches with contiguous and interleaved groups,
// under every preset, an agent override and a floor on σ.
func TestCompareFileMatchesCompare(t *testing.T) {
	var est []Estimator
	for _, p := range Presets() {
		o, err := Preset(p)
		if err != nil {
			t.Fatal(err)
		}
		est = append(est, Estimator{Name: p, Options: o})
	}
	base := DrMAS()
	base.MinStd = 0.05
	for _, spec := range []string{"drmas+searcher=grpo", "grpo-call+solver=at-grpo"} {
		e, err := ParseEstimator(spec, base)
		if err != nil {
			t.Fatal(err)
		}
		est = append(est, e)
	}
	rng := rand.New(rand.NewPCG(3, 5))
	interleaved := 0
	for trial := 0; trial < 20; trial++ {
		samples := randomBatch(rng)
		if trial%2 == 0 { // contiguous groups, in order of first appearance
			var uids []string
			for _, x := range samples {
				if !slices.Contains(uids, x.UID) {
					uids = append(uids, x.UID)
				}
			}
			slices.SortStableFunc(samples, func(a, b Sample) int { return slices.Index(uids, a.UID) - slices.Index(uids, b.UID) })
		}
		var in strings.Builder
		for i, x := range samples {
			fmt.Fprintf(&in, `{"uid":%q,"traj_uid":%q,"agent":%q,"score":%v,"i":%d}`+"\n", x.UID, x.TrajUID, x.Agent, x.Score, i)
		}
		input := in.String()
		recs, err := ReadRecords(strings.NewReader(input), "s.jsonl")
		if err != nil {
			t.Fatal(err)
		}
		held := make([]Sample, len(recs))
		for i := range recs {
			held[i] = recs[i].Sample
		}
		want, err := Compare(held, est, "drmas")
		if err != nil {
			t.Fatal(err)
		}
		sf, err := ScanSamples(strings.NewReader(input), int64(len(input)), "s.jsonl")
		if err != nil {
			t.Fatal(err)
		}
		if trial%2 == 0 && !sf.contiguous {
			t.Fatalf("trial %d: sorted groups scanned as interleaved", trial)
		}
		if !sf.contiguous {
			interleaved++
		}
		got, err := CompareFile(sf, est, "drmas")
		if err != nil {
			t.Fatal(err)
		}
		wj, wt := comparisonBytes(t, want)
		gj, gt := comparisonBytes(t, got)
		if !bytes.Equal(wj, gj) {
			t.Errorf("trial %d (%d samples): JSON differs:\n%s\nwant\n%s", trial, len(held), gj, wj)
		}
		if !bytes.Equal(wt, gt) {
			t.Errorf("trial %d (%d samples): table differs:\n%s\nwant\n%s", trial, len(held), gt, wt)
		}
	}
	if interleaved < 5 {
		t.Errorf("%d of 20 batches interleaved: the test shows little", interleaved)
	}
	// An empty file compares as an empty batch.
	sf, err := ScanSamples(strings.NewReader(""), 0, "empty.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	got, err := CompareFile(sf, est, "drmas")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := Compare(nil, est, "drmas")
	wj, wt := comparisonBytes(t, want)
	gj, gt := comparisonBytes(t, got)
	if !bytes.Equal(wj, gj) || !bytes.Equal(wt, gt) {
		t.Errorf("empty input: %s / %s, want %s / %s", gj, gt, wj, wt)
	}
}
