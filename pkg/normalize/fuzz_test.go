package normalize

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"testing"
)

// fuzzOptions picks a combination from one byte and an ε from another.
func fuzzOptions(b0, b1 byte) Options {
	opt := DrMAS()
	opt.Mean = []string{Global, Agent}[b0&1]
	opt.Std = []string{Global, Agent, None}[int(b0>>1&3)%3]
	opt.Weighting = []string{Step, Trajectory}[b0>>3&1]
	opt.Unbiased = b0>>4&1 == 0
	opt.MinStd = []float64{0, 0.01, 1, 1e-300}[b0>>5&3]
	opt.Eps = []float64{DefaultEps, MinEps, 1, 0.5}[b1&3]
	return opt
}

// fuzzSamples reads 4 bytes per sample: uid, traj, agent (few values, so groups collide) and a score
// (small multiples of 1/16, or from the next 8 bytes as raw float64 bits, any value at all).
func fuzzSamples(data []byte) []Sample {
	var out []Sample
	for len(data) >= 4 {
		b := data[:4]
		data = data[4:]
		score := float64(int8(b[3])) / 16
		if b[0]&0x80 != 0 && len(data) >= 8 {
			score = math.Float64frombits(binary.LittleEndian.Uint64(data))
			data = data[8:]
		}
		out = append(out, Sample{
			UID: string(rune('a' + b[0]%4)), TrajUID: string(rune('p' + b[1]%5)), Agent: string(rune('v' + b[2]%4)), Score: score,
		})
	}
	return out
}

// Any finite scores within ±MaxScore give finite advantages and statistics; anything else is an error;
// nothing panics.
func FuzzCompute(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 0, 16, 0, 1, 1, 16})
	f.Add([]byte{3, 1, 0, 0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 1, 0, 255})
	f.Add([]byte{2, 0, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0xf0, 0x7f, 1, 1, 1, 8})                      // +Inf
	f.Add([]byte{9, 2, 0x80, 1, 2, 0, 0x9c, 0x75, 0x88, 0x3c, 0xe4, 0x37, 0x7e, 0x4a, 1, 2, 3, 4}) // ≈ 1e50
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		opt := fuzzOptions(data[0], data[1])
		samples := fuzzSamples(data[2:])
		valid := true
		for _, x := range samples {
			valid = valid && math.Abs(x.Score) <= MaxScore
		}
		res, err := Compute(samples, opt)
		if !valid {
			if err == nil {
				t.Fatal("out-of-range score accepted")
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Advantages) != len(samples) {
			t.Fatalf("%d advantages for %d samples", len(res.Advantages), len(samples))
		}
		for i, a := range res.Advantages {
			if math.IsNaN(a) || math.IsInf(a, 0) {
				t.Fatalf("%s: sample %d %+v: advantage %v", opt, i, samples[i], a)
			}
		}
		for _, a := range res.Stats.Agents {
			for _, v := range []float64{a.ScoreMean, a.ScoreStd, a.AdvMean, a.AdvStd, a.AdvMin, a.AdvMax} {
				if math.IsNaN(v) || math.IsInf(v, 0) {
					t.Fatalf("%s: agent stats %+v", opt, a)
				}
			}
		}
		if _, err := json.Marshal(res.Stats); err != nil {
			t.Fatalf("stats do not encode: %v", err)
		}
	})
}

// ReadRecords never panics; what it accepts Compute accepts, and WriteRecords writes lines that read
// back to the same samples with the advantage in them.
func FuzzReadRecords(f *testing.F) {
	// Small seeds: the fuzzer minimizes every new input it finds, in time that grows with its length.
	f.Add([]byte(`{"uid": "q1", "traj_uid": "q1-0", "agent": "searcher", "turn": 0, "score": -0.01}
{"uid": "q1", "traj_uid": "q1-1", "agent": "verifier", "turn": 0, "score": 1}`))
	f.Add([]byte(`{"uid":"q","traj_uid":"t","agent":"a","score":NaN}`))
	f.Add([]byte(`{"uid":1,"traj_uid":2.5,"agent":"a","score":-1e-3,"advantage":7}` + "\n\n" + `{"uid":1,"traj_uid":3,"agent":"a","score":1}`))
	f.Add([]byte(`{"uid":"q","traj_uid":"t","agent":"a","score":1} {}`))
	f.Add([]byte(`[1,2]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		recs, err := ReadRecords(bytes.NewReader(data), "fuzz.jsonl")
		if err != nil {
			return
		}
		samples := make([]Sample, len(recs))
		for i := range recs {
			samples[i] = recs[i].Sample
		}
		res, err := Compute(samples, DrMAS())
		if err != nil {
			t.Fatalf("read accepted what Compute rejects: %v", err)
		}
		var out bytes.Buffer
		if err := WriteRecords(&out, recs, res.Advantages); err != nil {
			t.Fatal(err)
		}
		back, err := ReadRecords(&out, "out.jsonl")
		if err != nil {
			t.Fatalf("output does not read back: %v\n%s", err, out.Bytes())
		}
		if len(back) != len(recs) {
			t.Fatalf("%d records read back, want %d", len(back), len(recs))
		}
		for i := range back {
			if back[i].Sample != recs[i].Sample {
				t.Fatalf("record %d: %+v read back as %+v", i, recs[i].Sample, back[i].Sample)
			}
			var fields map[string]any
			if err := json.Unmarshal(back[i].raw, &fields); err != nil {
				t.Fatalf("line %d is not JSON: %v", i, err)
			}
			if a, ok := fields["advantage"].(float64); !ok || a != res.Advantages[i] {
				t.Fatalf("line %d advantage %v, want %v", i, fields["advantage"], res.Advantages[i])
			}
		}
	})
}

// The quick walk over valid lines and encoding/json's decoder agree on every field and every error.
func FuzzWalkMatchesDecoder(f *testing.F) {
	f.Add([]byte(`{"uid":"q","traj_uid":"t","agent":"a","score":1}`))
	f.Add([]byte(` { "u\u0069d" : 3 , "x": {"a": ["}", "\""]}, "traj_uid":"t\"", "agent":"a","score":-1.5e3, "advantage" : [1, {"b": null}] } `))
	f.Add([]byte(`{"uid":"q","uid":"t","agent":"","score":true}`))
	f.Add([]byte(`"uid"`))
	f.Fuzz(func(t *testing.T, line []byte) {
		if !json.Valid(line) {
			return
		}
		walked := lineParser{rec: Record{advStart: -1, advEnd: -1}}
		decoded := walked
		errW, errD := walked.walk(line), decoded.decode(line)
		if fmt.Sprint(errW) != fmt.Sprint(errD) {
			t.Fatalf("walk error %v, decoder error %v", errW, errD)
		}
		w, d := walked.rec, decoded.rec
		if errW == nil && (w.Sample != d.Sample || w.advStart != d.advStart || w.advEnd != d.advEnd || walked.seen != decoded.seen) {
			t.Fatalf("walk %+v, decoder %+v", walked, decoded)
		}
	})
}
