// Package torch is the thin runtime layer drmas puts between its code and gotch: one locked OS thread
// for all libtorch work (Do), a nestable no-grad guard (NoGrad), scopes that free every intermediate
// tensor of a step deterministically (Scope, Scoped), seeding (ManualSeed), thread count
// (SetupThreads) and device selection (ParseDevice).
package torch
