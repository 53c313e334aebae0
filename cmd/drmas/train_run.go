package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/rs/zerolog/log"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/dist"
	"github.com/drmas/drmas/pkg/dist/c10d"
	"github.com/drmas/drmas/pkg/model"
	"github.com/drmas/drmas/pkg/report"
	"github.com/drmas/drmas/pkg/train"
)

// launchedVar marks the workers that drmas train --nproc started.
const launchedVar = "DRMAS_LAUNCHED"

// runTrain builds the trainer and runs it; SIGINT/SIGTERM finish the iteration, checkpoint, exit 0.
// With --nproc N it starts N ranks of itself instead; in a launch environment it is one rank.
func runTrain(cmd *cobra.Command, cfg *config.Config, f trainFlags) error {
	e, distributed, err := dist.EnvFromOS()
	if err != nil {
		return badInput(err)
	}
	if f.nproc < 1 {
		return badInput(fmt.Errorf("--nproc %d: want at least 1", f.nproc))
	}
	if f.nproc > 1 && distributed && os.Getenv(launchedVar) == "" {
		return badInput(fmt.Errorf("--nproc %d inside a launch environment (WORLD_SIZE=%d is set): use one or the other", f.nproc, e.WorldSize))
	}
	if f.nproc > 1 && !distributed {
		return launchTrain(cmd, f.nproc)
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var progress io.Writer
	if term.IsTerminal(int(os.Stderr.Fd())) && e.Rank == 0 {
		shared := report.NewTerminal(os.Stderr) // logs clear the bar's line and draw it again under them
		progress = shared
		logTo(shared.Log(os.Stderr))
	}
	var group *c10d.Group
	device := global.device
	if distributed {
		log.Logger = log.With().Int("rank", e.Rank).Logger()
		device = train.RankDevice(device, e.LocalRank)
		if group, err = joinGroup(cfg, e, device); err != nil {
			if errors.Is(err, c10d.ErrMismatch) {
				return badInput(err) // the ranks were started differently: nothing ran
			}
			return err
		}
	}
	tr, err := train.New(ctx, cfg, train.Options{Device: device, Resume: f.resume, Force: f.force, Progress: progress, Group: group})
	if err != nil {
		// Nothing ran yet: the run folder, config, data, model or tokenizer files, or the
		// checkpoint did not fit (exit 2). Failures once training runs exit 1.
		group.Abort()
		return badInput(err)
	}
	defer tr.Close()
	if err := tr.Run(ctx); err != nil {
		group.Abort()
		return err
	}
	return group.Close()
}

// launchTrain reruns this command as n ranks (the same arguments; the workers see the launch
// environment) and waits for them. A worker's bad-input failure (exit 2) is the launch's.
func launchTrain(cmd *cobra.Command, n int) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	err = dist.Launch(cmd.Context(), dist.LaunchOptions{N: n, Program: exe, Args: os.Args[1:], Env: []string{launchedVar + "=1"}})
	var ee *dist.ExitError
	if errors.As(err, &ee) && ee.Code == 2 {
		return badInput(err)
	}
	return err
}

// joinGroup forms this rank's process group: the ranks compare their resolved configs and the drmas
// binary they run.
func joinGroup(cfg *config.Config, e dist.Env, device string) (*c10d.Group, error) {
	id, err := cfg.Identity()
	if err != nil {
		return nil, err
	}
	id["drmas.version"] = drmasVersion()
	models := make([]model.Config, len(cfg.Models))
	for i, m := range cfg.Models {
		models[i] = cfg.WeightsOf(m)
	}
	return c10d.Join(e, cfg.Dist, train.UsesCUDA(models, device), id)
}
