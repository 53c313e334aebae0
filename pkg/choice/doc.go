// Package choice is the registry behind the config keys that name an implementation (a loss
// aggregation mode, a KL estimator, an engine, a model family …): a Set (NewSet, Add) holds one key's
// names, pkg/config asks it (Check, Has, Names) and the implementer proves it covers them (Covers).
//
// Each set belongs to the package that implements its choices: that package declares the set and
// registers every name it implements, and pkg/config checks a config by asking the sets, so a new
// choice is its implementation plus one registration line, and pkg/config never lists another
// package's names. The package is dependency-free so that pkg/config builds and tests without
// libtorch: a choice implemented on libtorch (pkg/train, pkg/policy) is registered in a libtorch-free
// package (pkg/algo; pkg/arch for the model families pkg/policy runs), which the implementer
// checks it covers.
package choice
