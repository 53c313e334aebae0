package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/rs/zerolog/log"
	"github.com/spf13/cobra"

	"github.com/drmas/drmas/pkg/policy"
	"github.com/drmas/drmas/pkg/torch"
)

func newExportCmd() *cobra.Command {
	var model, adapter, out, dtype string
	cmd := &cobra.Command{
		Use:   "export --model BASE --adapter ADAPTER --out DIR",
		Short: "Merge a LoRA adapter into its base and write a plain Hugging Face model folder",
		Long: `Load a base model folder and a PEFT LoRA adapter folder (adapter_config.json,
adapter_model.safetensors: a checkpoint's step-N/<adapter id>/, or one PEFT wrote), merge
them (W + (alpha/r)·B·A in every adapted projection, computed in float32) and write the
result to --out as a plain Hugging Face folder: config.json, model.safetensors and the base's
tokenizer files, which drmas generate, drmas serve, transformers and vLLM load without the
adapter. --out must not exist or be empty. docs/lora.md.`,
		Example: `  CKPT=$(ls -dv runs/toy-math-lora/step-*[0-9] | tail -1)   # the newest checkpoint of drmas train --config configs/toy-math-lora.yaml
  drmas export --model $CKPT/toy --adapter $CKPT/solver --out solver-merged
  drmas generate --model solver-merged --prompt "P3+1" --temperature 0`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var errs []error
			for flag, v := range map[string]string{"--model": model, "--adapter": adapter, "--out": out} {
				if v == "" {
					errs = append(errs, fmt.Errorf("%s is required", flag))
				}
			}
			if adapter != "" && !policy.IsAdapterDir(adapter) {
				errs = append(errs, fmt.Errorf("--adapter %s: no %s (want a PEFT adapter folder)", adapter, policy.AdapterConfigFile))
			}
			if out != "" {
				if ents, err := os.ReadDir(out); err == nil && len(ents) > 0 {
					errs = append(errs, fmt.Errorf("--out %s: exists and is not empty (export never overwrites a folder)", out))
				} else if err != nil && !errors.Is(err, os.ErrNotExist) {
					errs = append(errs, fmt.Errorf("--out: %w", err))
				}
			}
			dev, dt, err := deviceAndDType(dtype)
			if err != nil {
				errs = append(errs, err)
			}
			if err := errors.Join(errs...); err != nil {
				return badInput(err)
			}
			p, err := loadModelFolder(model, dev, dt, 0)
			if err != nil {
				return err
			}
			ap, err := withAdapter(p, adapter)
			if err != nil {
				return err
			}
			err = torch.Do(func() error {
				merged, err := ap.Model.Adapter().Merge(p.Model)
				if err != nil {
					return err
				}
				// The adapter's weights were checked on load; the base's, or the sum overflowing
				// the dtype, can still make a NaN or infinite model: never write one.
				if w := torch.FirstNonFinite(policy.SplitParams(merged.Parameters())); w != "" {
					return fmt.Errorf("the merged weight %s holds NaN or infinite values (the base %s or its sum with the adapter in %s): refused, nothing written", w, model, merged.DType())
				}
				mp, err := policy.NewPolicy(p.ID, merged, p.Tok, p.Chat)
				if err != nil {
					return err
				}
				mp.SourceDir = p.SourceDir
				return mp.Save(out)
			})
			if err != nil {
				return fmt.Errorf("export %s: %w", out, err)
			}
			log.Info().Str("base", model).Str("adapter", adapter).Str("out", out).Msg("merged model written")
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&model, "model", "", "base model folder (Hugging Face layout)")
	fl.StringVar(&adapter, "adapter", "", "PEFT LoRA adapter folder made for that base")
	fl.StringVar(&out, "out", "", "folder to write the merged model to (must not exist, or be empty)")
	fl.StringVar(&dtype, "dtype", "auto", dtypeHelp)
	return cmd
}

// withAdapter loads the PEFT adapter folder dir for p's model (in its dtype, on its device) and
// returns the adapted policy, named after the folder. A folder that does not load is a usage error.
func withAdapter(p *policy.Policy, dir string) (*policy.Policy, error) {
	var ap *policy.Policy
	err := torch.Do(func() error {
		a, err := policy.LoadAdapter(dir, filepath.Base(filepath.Clean(dir)), p.Model, p.Model.DType())
		if err != nil {
			return err
		}
		if w := torch.FirstNonFinite(policy.SplitParams(a.Parameters())); w != "" {
			a.Free()
			return fmt.Errorf("adapter %s: weight %s of %s holds NaN or infinite values: refused", dir, w, policy.AdapterWeightsFile)
		}
		ap, err = policy.NewAdapterPolicy(a.Name, p, a)
		return err
	})
	if err != nil {
		return nil, badInput(err)
	}
	a := ap.Model.Adapter()
	log.Info().Str("adapter", dir).Int("rank", a.Config.Rank).Float64("alpha", a.Config.Alpha).Strs("targets", a.Config.Targets).Msg("adapter loaded")
	return ap, nil
}
