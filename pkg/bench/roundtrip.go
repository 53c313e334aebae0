package bench

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog/log"
	"github.com/sugarme/gotch"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// RoundTripOptions sets up RoundTrip.
type RoundTripOptions struct {
	Dir           string      // where the checkpoint is written (created; files drmas writes only)
	DType         gotch.DType // the weights' dtype
	MaxShardBytes int64       // shard size for SaveSharded (0: policy.DefaultMaxShardBytes)
	Seed          int64
	// Generation and training shape: Batch rows of PromptLen random tokens, ResponseLen generated
	// (or, for the training step, scored) tokens.
	Batch, PromptLen, ResponseLen int
	Train                         bool // also time a training step (a warm-up step, then one timed)
}

// RoundTripResult holds what RoundTrip measured. Peak resident memory is the process's high-water
// mark during each phase (Linux's VmHWM, reset before the phase); -1 where it cannot be read.
type RoundTripResult struct {
	Params          int64   `json:"params"`
	DType           string  `json:"dtype"`
	ModelMB         float64 `json:"model_mb"` // the weights' bytes
	Shards          int     `json:"shards"`   // safetensors files written
	InitSeconds     float64 `json:"init_s"`
	SaveSeconds     float64 `json:"save_s"`
	LoadSeconds     float64 `json:"load_s"`
	InitPeakMB      float64 `json:"init_peak_rss_mb"`
	SavePeakMB      float64 `json:"save_peak_rss_mb"`
	LoadPeakMB      float64 `json:"load_peak_rss_mb"` // the random model freed first
	BitExact        bool    `json:"bit_exact"`        // every loaded tensor's bytes hash as saved
	GenTokensPerSec float64 `json:"gen_tokens_per_s"`
	DecodeMsPerStep float64 `json:"decode_ms_per_step"`
	GenPeakMB       float64 `json:"gen_peak_rss_mb"`
	TrainMsPerStep  float64 `json:"train_ms_per_step,omitempty"`
	TrainTokPerSec  float64 `json:"train_tokens_per_s,omitempty"`
	TrainPeakMB     float64 `json:"train_peak_rss_mb,omitempty"`
	TrainChanged    bool    `json:"train_changed_weights,omitempty"` // the AdamW step moved the weights
}

// RoundTrip checks a real-size model end to end on cfg (a real config.json, random weights): it
// initialises the model, saves it (sharded past MaxShardBytes), frees it, loads the folder back and
// compares every tensor's bytes (by SHA-256, so that two copies never sit in memory), generates, and
// optionally takes a training step with AdamW; it reports time and peak memory per phase. It enters
// torch.Do itself: call it from outside.
func RoundTrip(cfg arch.Config, o RoundTripOptions) (RoundTripResult, error) {
	if o.Batch <= 0 || o.PromptLen <= 0 || o.ResponseLen <= 0 {
		return RoundTripResult{}, fmt.Errorf("roundtrip: batch, prompt length and response length must be > 0")
	}
	r := RoundTripResult{DType: policy.DTypeName(o.DType)}
	m, saved, err := saveAndLoad(cfg, o, &r)
	if err != nil {
		return r, fmt.Errorf("roundtrip: %w", err)
	}
	r.Shards, r.ModelMB = checkpointFiles(o.Dir, r.Params*int64(o.DType.Size()))
	bo := Options{Batch: o.Batch, PromptLen: o.PromptLen, ResponseLen: o.ResponseLen, Steps: 1, Seed: o.Seed}
	rng := rand.New(rand.NewPCG(uint64(o.Seed), 11))
	seqs, prompts := randomSequences(rng, o.Batch, o.PromptLen, func(int) int { return o.ResponseLen }, cfg.VocabSize)
	var br Result
	if err := phase("generate", new(float64), &r.GenPeakMB, func() error { return benchGenerate(m, prompts, bo, &br) }); err != nil {
		return r, fmt.Errorf("roundtrip: generate: %w", err)
	}
	r.GenTokensPerSec, r.DecodeMsPerStep = br.GenTokensPerSec, br.DecodeMsPerStep
	log.Info().Float64("tokens_per_s", r.GenTokensPerSec).Float64("decode_ms_per_step", r.DecodeMsPerStep).Msg("roundtrip: generated")
	if o.Train {
		err := torch.Do(func() error {
			if err := phase("train", new(float64), &r.TrainPeakMB, func() error { return benchTrain(m, seqs, bo, &br) }); err != nil {
				return err
			}
			after, err := hashWeights(m)
			if err != nil {
				return err
			}
			r.TrainChanged = after["model.layers.0.mlp.down_proj.weight"] != saved["model.layers.0.mlp.down_proj.weight"]
			return nil
		})
		if err != nil {
			return r, fmt.Errorf("roundtrip: train: %w", err)
		}
		r.TrainMsPerStep, r.TrainTokPerSec = br.TrainMsPerStep, br.TrainTokensPerSec
	}
	_ = torch.Do(func() error { m.Free(); return nil })
	return r, nil
}

// saveAndLoad initialises a random model of cfg, saves it to o.Dir, frees it and loads the folder
// back, timing each phase into r and comparing the loaded weights' hashes with the saved ones
// (r.BitExact). It returns the loaded model and the saved weights' hashes.
func saveAndLoad(cfg arch.Config, o RoundTripOptions, r *RoundTripResult) (*policy.Model, map[string][32]byte, error) {
	var m *policy.Model
	var saved map[string][32]byte
	err := torch.Do(func() error {
		var err error
		if err := phase("init", &r.InitSeconds, &r.InitPeakMB, func() error {
			m, err = policy.NewRandom(cfg, gotch.CPU, o.DType, o.Seed)
			return err
		}); err != nil {
			return err
		}
		r.Params = m.NumParams()
		if saved, err = hashWeights(m); err != nil {
			return err
		}
		if err := os.MkdirAll(o.Dir, 0o755); err != nil {
			return err
		}
		if err := phase("save", &r.SaveSeconds, &r.SavePeakMB, func() error { return m.SaveSharded(o.Dir, o.MaxShardBytes) }); err != nil {
			return err
		}
		m.Free()
		m = nil
		torch.ReleaseMemory()
		if err := phase("load", &r.LoadSeconds, &r.LoadPeakMB, func() error {
			m, err = policy.Load(o.Dir, gotch.CPU, o.DType)
			return err
		}); err != nil {
			return err
		}
		loaded, err := hashWeights(m)
		if err != nil {
			return err
		}
		r.BitExact = len(loaded) == len(saved)
		for name, h := range saved {
			r.BitExact = r.BitExact && loaded[name] == h
		}
		log.Info().Bool("bit_exact", r.BitExact).Int("tensors", len(saved)).Msg("roundtrip: loaded weights compared")
		return nil
	})
	return m, saved, err
}

// phase runs fn, recording its wall time and the peak resident memory while it ran, and logs them
// (so that a run killed later keeps what it measured).
func phase(name string, seconds, peakMB *float64, fn func() error) error {
	resetPeakRSS()
	start := time.Now()
	err := fn()
	*seconds = time.Since(start).Seconds()
	*peakMB = peakRSSMB()
	log.Info().Str("phase", name).Float64("seconds", *seconds).Float64("peak_rss_mb", *peakMB).Err(err).Msg("roundtrip")
	return err
}

// hashWeights returns the SHA-256 of each parameter's bytes, copying one tensor out at a time.
func hashWeights(m *policy.Model) (map[string][32]byte, error) {
	out := map[string][32]byte{}
	for _, p := range m.Parameters() {
		b, err := torch.Bytes(p.T)
		if err != nil {
			return nil, err
		}
		out[p.Name] = sha256.Sum256(b)
	}
	return out, nil
}

// checkpointFiles counts the safetensors files in dir; the model's size is given in bytes.
func checkpointFiles(dir string, modelBytes int64) (int, float64) {
	files, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	return len(files), float64(modelBytes) / (1 << 20)
}

// resetPeakRSS resets the process's resident-memory high-water mark (Linux: clear_refs 5).
func resetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

// peakRSSMB is the process's resident-memory high-water mark in MiB (VmHWM), or -1.
func peakRSSMB() float64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			if err != nil {
				return -1
			}
			return kb / 1024
		}
	}
	return -1
}
