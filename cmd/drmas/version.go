package main

import (
	"encoding/json"
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"

	"github.com/drmas/drmas/pkg/dist/c10d"
	"github.com/drmas/drmas/pkg/torch"
)

// version is set at build time with -ldflags "-X main.version=..."; otherwise the module version.
var version = ""

func newVersionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "version",
		Short:   "Print the drmas version, the libtorch it is linked with, the CUDA devices it sees and its data-parallel backends",
		Example: "  drmas version\n  drmas version --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			v := drmasVersion()
			var cuda bool
			var devices int
			var th torch.Threads
			_ = torch.Do(func() error {
				cuda, devices = torch.CUDAAvailable(), torch.CUDADeviceCount()
				th = torch.SetupThreads(torch.Threads{}) // the defaults every command starts with
				return nil
			})
			backends := []string{"gloo"}
			if c10d.NCCLAvailable() {
				backends = append(backends, "nccl")
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(map[string]any{
					"drmas": v, "libtorch": torch.Version(), "cuda": cuda, "cuda_devices": devices,
					"cpu_gemm": torch.GEMM(), "allocator": torch.Allocator(), "dist_backends": backends, "threads": map[string]int{
						"intra_op": th.IntraOp, "inter_op": th.InterOp, "matrix_products": th.BLAS}})
			}
			fmt.Fprintf(out, "drmas %s\nlibtorch %s\ncpu: matrix products on %s (%d threads), %d/%d intra/inter-op threads, %s malloc\n",
				v, torch.Version(), torch.GEMM(), th.BLAS, th.IntraOp, th.InterOp, torch.Allocator())
			if cuda {
				fmt.Fprintf(out, "cuda: available, %d device(s)\n", devices)
			} else {
				fmt.Fprintln(out, "cuda: not available (CPU only)")
			}
			fmt.Fprintf(out, "data-parallel (c10d): %s\n", strings.Join(backends, ", "))
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func drmasVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 7 {
				return "dev-" + s.Value[:7]
			}
		}
		if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			return bi.Main.Version
		}
	}
	return "dev"
}
