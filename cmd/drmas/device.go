package main

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/rs/zerolog/log"
	"github.com/sugarme/gotch"

	"github.com/drmas/drmas/pkg/arch"
	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

// deviceAndDType reads the --device flag and a command's --dtype ("auto" = gotch.Invalid, the
// model's own dtype).
func deviceAndDType(dtype string) (gotch.Device, gotch.DType, error) {
	var errs []error
	dev, err := torch.ParseDevice(global.device)
	if err != nil {
		errs = append(errs, fmt.Errorf("--device: %w", err))
	}
	dt := gotch.Invalid
	if dtype != "auto" {
		if dt, err = policy.ParseDType(dtype); err != nil {
			errs = append(errs, fmt.Errorf("--dtype: %w", err))
		}
	}
	return dev, dt, errors.Join(errs...)
}

// dtypeHelp describes the --dtype flag of the commands that load a model outside a config.
const dtypeHelp = "weights dtype: auto (float32 on CPU; on CUDA the model's torch_dtype, bfloat16 for a preset), float32, bfloat16, float16, float64"

// autoDType resolves --dtype auto (dt = gotch.Invalid; any other dt is kept): float32 on the CPU,
// where bfloat16 matmuls are slow; on CUDA the model folder's own torch_dtype, or bfloat16 for a model
// without a folder (a preset).
func autoDType(dt gotch.DType, dev gotch.Device, modelDir string) (gotch.DType, error) {
	switch {
	case dt != gotch.Invalid:
		return dt, nil
	case !dev.IsCuda():
		return gotch.Float, nil
	case modelDir == "":
		return gotch.BFloat16, nil
	}
	cfg, err := arch.ReadConfig(filepath.Join(modelDir, "config.json"))
	if err != nil {
		return gotch.Invalid, err
	}
	return policy.ParseDType(cfg.TorchDType)
}

// loadModelFolder loads a model folder (--model) as a policy on dev, with --dtype auto resolved;
// libtorch's threads are set up first (torch.SetupThreads; threads 0 = the default count). A folder
// that does not load is a usage error.
func loadModelFolder(dir string, dev gotch.Device, dt gotch.DType, threads int) (*policy.Policy, error) {
	dt, err := autoDType(dt, dev, dir)
	if err != nil {
		return nil, badInput(err)
	}
	var p *policy.Policy
	err = torch.Do(func() error {
		torch.SetupThreads(torch.Threads{IntraOp: threads})
		var err error
		p, err = policy.LoadPolicy(filepath.Base(filepath.Clean(dir)), dir, dev, dt)
		return err
	})
	if err != nil {
		return nil, badInput(err)
	}
	log.Info().Str("model", dir).Str("type", p.Model.Config.ModelType).Int64("params", p.Model.NumParams()).
		Str("device", torch.DeviceString(dev)).Str("dtype", policy.DTypeName(dt)).Str("chat_template", p.Chat.Name()).
		Msg("model loaded")
	return p, nil
}
