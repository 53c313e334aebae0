package main

import (
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/rs/zerolog/log"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// globalFlags are the flags every command shares.
type globalFlags struct {
	logLevel   string
	logFormat  string
	device     string
	cpuProfile string
}

var global globalFlags

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "drmas",
		Short: "Post-train multi-agent LLM systems with GRPO and Dr. MAS",
		Long: `drmas trains teams of LLM agents (solver/verifier, searcher/answerer, ...) with
reinforcement learning, using GRPO with Dr. MAS agent-wise advantage normalization
(arXiv 2602.08847), on libtorch (CPU or CUDA), from one binary.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if err := setupLogging(global.logLevel, global.logFormat); err != nil {
				return badInput(err)
			}
			return startProfile(global.cpuProfile)
		},
		PersistentPostRun: func(cmd *cobra.Command, args []string) { stopProfile() },
	}
	pf := root.PersistentFlags()
	pf.StringVar(&global.logLevel, "log-level", "info", "log level: debug|info|warn|error")
	pf.StringVar(&global.logFormat, "log-format", "", "log format: console|json (default: console on a terminal, json otherwise)")
	pf.StringVar(&global.device, "device", "auto", "default device for models whose config names none: auto|cpu|cuda|cuda:N")
	pf.StringVar(&global.cpuProfile, "cpuprofile", "", "write a Go CPU profile to this file (read it with go tool pprof)")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return badInput(err) })

	// Every command, one line each (help lists them alphabetically).
	root.AddCommand(
		// Training and evaluation of a team.
		newTrainCmd(),
		newEvalCmd(),
		newInspectGradsCmd(),
		newPlotCmd(),
		// Advantages for any framework's rollouts.
		newAdvantagesCmd(),
		newEstimatorsCmd(),
		// One model: generation, serving, LoRA merge, checks and speed.
		newGenerateCmd(),
		newServeCmd(),
		newExportCmd(),
		newRoundTripCmd(),
		newBenchCmd(),
		newVersionCmd(),
	)
	return root
}

// setupLogging points zerolog at stderr in the chosen format.
func setupLogging(level, format string) error {
	lvl, err := zerolog.ParseLevel(strings.ToLower(level))
	if err != nil || level == "" {
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	zerolog.SetGlobalLevel(lvl)
	zerolog.DurationFieldFormat = zerolog.DurationFormatString // "3m12.5s", not a bare number of milliseconds
	if format == "" {
		format = "json"
		if term.IsTerminal(int(os.Stderr.Fd())) {
			format = "console"
		}
	}
	if format != "console" && format != "json" {
		return fmt.Errorf("--log-format %q: want console or json", format)
	}
	logFormat = format
	logTo(os.Stderr)
	return nil
}

// logFormat is --log-format as setupLogging resolved it.
var logFormat = "json"

// logTo sends the logs to w (stderr, or a terminal shared with a progress bar) in logFormat.
func logTo(w io.Writer) {
	if logFormat == "console" {
		log.Logger = zerolog.New(zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly}).With().Timestamp().Logger()
		return
	}
	log.Logger = zerolog.New(w).With().Timestamp().Logger()
}

var profileFile *os.File

func startProfile(path string) error {
	if path == "" {
		return nil
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	profileFile = f
	return pprof.StartCPUProfile(f)
}

func stopProfile() {
	if profileFile != nil {
		pprof.StopCPUProfile()
		profileFile.Close()
		profileFile = nil
	}
}
