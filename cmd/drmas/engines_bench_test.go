package main

import (
	"context"
	"testing"
	"time"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/engine"
	"github.com/drmas/drmas/pkg/env"
	"github.com/drmas/drmas/pkg/llm"
	"github.com/drmas/drmas/pkg/train"
)

// BenchmarkToySearchRollout times one toy-search rollout (configs/toy-search.yaml: 16 questions × 8
// samples through the verifier / searcher / answerer, one shared model) sampled in-process on one
// thread (local) against the same rollout sampled on two `drmas serve` replicas of one thread each
// (serve2, SGLang protocol). Run it alone: go test ./cmd/drmas -run '^$' -bench ToySearchRollout -benchtime 10x
func BenchmarkToySearchRollout(b *testing.B) {
	cfg, err := config.Load("../../configs/toy-search.yaml", []string{"run.dir=" + b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	cfg.Models[0].Tokenizer = "../../" + cfg.Models[0].Tokenizer
	team, err := train.LoadTeam(cfg, "cpu", "")
	if err != nil {
		b.Fatal(err)
	}
	defer team.Close()
	tasks := team.Train[:cfg.Algorithm.BatchSize]
	rollout := func(b *testing.B, gen llm.Generator) {
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := team.Orchestra.Run(context.Background(), gen, tasks, cfg.Algorithm.GroupSize, env.RunOptions{Iteration: i + 1, Seed: 1}); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("local", func(b *testing.B) { rollout(b, team.Router) })
	b.Run("serve2", func(b *testing.B) {
		dir := b.TempDir()
		if err := saveModel(team, "small", dir); err != nil {
			b.Fatal(err)
		}
		r1, r2 := startServe(b, dir), startServe(b, dir)
		p := team.Router["small"]
		c, err := engine.New(context.Background(), "small", engine.Config{Engine: engine.SGLang, URLs: []string{r1.URL, r2.URL},
			MaxInflight: 64, Timeout: time.Minute}, engine.Codec{Prompt: p.EncodePromptWith, Tok: p.Tok, StopIDs: p.StopIDs})
		if err != nil {
			b.Fatal(err)
		}
		rollout(b, engine.Router{"small": c})
	})
}
