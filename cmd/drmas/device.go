package main

import (
	"errors"
	"fmt"

	"github.com/sugarme/gotch"

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
