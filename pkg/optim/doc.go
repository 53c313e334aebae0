// Package optim holds the optimizer that drmas train, its format warm-up and drmas bench all take:
// AdamW (NewAdamW, AdamWOptions), with float32 master weights for lower-precision models and an
// optional host-memory (offloaded) state.
package optim
