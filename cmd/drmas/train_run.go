package main

import (
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/drmas/drmas/pkg/config"
	"github.com/drmas/drmas/pkg/train"
)

// runTrain builds the trainer and runs it; SIGINT/SIGTERM finish the iteration, checkpoint, exit 0.
func runTrain(cmd *cobra.Command, cfg *config.Config, f trainFlags) error {
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var progress io.Writer
	if term.IsTerminal(int(os.Stderr.Fd())) {
		progress = os.Stderr
	}
	tr, err := train.New(ctx, cfg, train.Options{Device: global.device, Resume: f.resume, Force: f.force, Progress: progress})
	if err != nil {
		// Nothing ran yet: the run folder, config, data, model or tokenizer files, or the
		// checkpoint did not fit (exit 2). Failures once training runs exit 1.
		return badInput(err)
	}
	defer tr.Close()
	return tr.Run(ctx)
}
